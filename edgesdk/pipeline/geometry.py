"""Where the sent image's pixels land in the model's input, and back (issue 42).

The resize (stretched, or letterboxed: fitted, centred and padded) and the center crop move and
scale the image on each axis: ``x_input = x_image * scale_x + offset_x`` (and so for y). A
detector finds its boxes in the model input's pixels; ``ImageFrame.to_image`` undoes the two
steps, so ``/predict`` answers boxes in the pixels of the image that was sent, clipped to it,
as MediaPipe Tasks and Ultralytics answer them. ``image.to_tensor`` places the pixels with the
same ``placement`` and ``crop_origin``, so the pixels and the boxes cannot disagree.

Coordinates are continuous, origin at the image's top-left corner: pixel (i, j) covers
[i, i + 1) × [j, j + 1), so an image ``width`` wide spans 0..``width`` (Pillow's resize and
Ultralytics' ``scale_boxes`` use the same convention).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.schemas.pipeline import CenterCrop, ImagePre, Resize


@dataclass(frozen=True)
class ResizedPlacement:
    """The resize step: the image scaled to ``width`` × ``height``, its top-left corner at
    (``left``, ``top``) of a ``canvas_width`` × ``canvas_height`` canvas (the rest: padding)."""

    width: int
    height: int
    left: int
    top: int
    canvas_width: int
    canvas_height: int


def placement(width: int, height: int, resize: Resize | None) -> ResizedPlacement:
    """Where the resize step puts a ``width`` × ``height`` image. Letterbox: the largest scale
    that fits, sides rounded as Ultralytics' ``LetterBox`` rounds them, centred (an odd margin's
    extra pixel goes right or below)."""
    if resize is None:
        return ResizedPlacement(width, height, 0, 0, width, height)
    if resize.letterbox is None:
        return ResizedPlacement(resize.width, resize.height, 0, 0, resize.width, resize.height)
    ratio = min(resize.width / width, resize.height / height)
    fitted_w = min(resize.width, max(1, round(width * ratio)))
    fitted_h = min(resize.height, max(1, round(height * ratio)))
    left, top = (resize.width - fitted_w) // 2, (resize.height - fitted_h) // 2
    return ResizedPlacement(fitted_w, fitted_h, left, top, resize.width, resize.height)


def crop_origin(width: int, height: int, crop: CenterCrop | None) -> tuple[int, int]:
    """The top-left corner of the central crop of a ``width`` × ``height`` image (422 when smaller)."""
    if crop is None:
        return 0, 0
    if crop.height > height or crop.width > width:
        raise PipelineInputError(
            422, f"image is {width}x{height}, smaller than the center crop {crop.width}x{crop.height}"
        )
    return (width - crop.width) // 2, (height - crop.height) // 2


@dataclass(frozen=True)
class ImageFrame:
    """The sent image's size and how its pixels map into the model input's."""

    width: int
    height: int
    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float

    def to_image(self, boxes: np.ndarray) -> np.ndarray:
        """(K, 4) xyxy boxes in the model input's pixels → the sent image's pixels, clipped to it."""
        mapped = np.empty_like(boxes, dtype=np.float64)
        mapped[:, 0::2] = np.clip((boxes[:, 0::2] - self.offset_x) / self.scale_x, 0, self.width)
        mapped[:, 1::2] = np.clip((boxes[:, 1::2] - self.offset_y) / self.scale_y, 0, self.height)
        return mapped

    def describe(self) -> dict[str, object]:
        """What ``/predict`` says of its boxes' coordinates (the answer's ``box_frame``)."""
        return {"coordinates": "image_pixels", "format": "xyxy", "width": self.width, "height": self.height}


def image_frame(width: int, height: int, pre: ImagePre) -> ImageFrame:
    """The frame of a ``width`` × ``height`` image going through ``pre``'s resize and crop."""
    placed = placement(width, height, pre.resize)
    left, top = crop_origin(placed.canvas_width, placed.canvas_height, pre.center_crop)
    return ImageFrame(width, height, placed.width / width, placed.height / height, placed.left - left, placed.top - top)
