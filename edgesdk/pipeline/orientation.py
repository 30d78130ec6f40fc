"""A phone photo reaches the model the right way up: the EXIF Orientation tag applied (issue 42).

A phone stores a portrait photo as its sensor read it (landscape) and says in EXIF (tag 0x0112,
values 1-8) how to turn it for display. ``PIL.ImageOps.exif_transpose``, what the usual Python
loop (and torchvision or timm users) call, applies it; a pipeline that did not sent the model a
sideways image, and the user got another answer than their own code. So the pipeline turns the
decoded image as ``exif_transpose`` does, before its steps, unless the bundle says
``image.exif_orientation: false``; the frame boxes are mapped back to is the turned image's.

The tag is read from the header only, before anything is decoded, as Pillow's
``Image.getexif`` reads it (EXIF, else XMP's ``tiff:Orientation``); a PNG's eXIf chunk after the
image data is not read (reading it means decoding the image before it is charged). A block
Pillow cannot parse (truncated, looping, hostile) or a value other than 1-8 is ignored: the
image is served as stored, as ``exif_transpose`` leaves an image with a value it does not know.
"""

from __future__ import annotations

import logging
from typing import Any

from edgesdk.schemas.pipeline import ImagePre

log = logging.getLogger(__name__)

ORIENTATION_TAG = 0x0112

#: Orientation value → the ``PIL.Image.Transpose`` that shows the image upright (``exif_transpose``'s table).
TRANSPOSES = {
    2: "FLIP_LEFT_RIGHT",
    3: "ROTATE_180",
    4: "FLIP_TOP_BOTTOM",
    5: "TRANSPOSE",
    6: "ROTATE_270",
    7: "TRANSVERSE",
    8: "ROTATE_90",
}

Box = tuple[float, float, float, float]


def read_orientation(image: Any, pre: ImagePre) -> int:
    """The orientation (1-8) the not yet decoded ``image`` asks for; 1 where the pipeline turns
    it off, the image has none, or its EXIF cannot be read."""
    if pre.exif_orientation is False:
        return 1
    from PIL import Image

    try:
        # Image.getexif, not the image's own: PNG's would decode the image to look past its data.
        value = Image.Image.getexif(image).get(ORIENTATION_TAG, 1)
    except Exception as exc:  # noqa: BLE001 - Pillow's EXIF parser raises many untyped errors on hostile bytes; the tag is advisory
        log.debug("EXIF orientation unreadable, the image is served as stored: %s", exc)
        return 1
    return value if isinstance(value, int) and value in TRANSPOSES else 1


def swaps_sides(orientation: int) -> bool:
    """Orientations 5-8 turn the image a quarter: its width becomes its height."""
    return orientation >= 5


def oriented_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """The size of a stored ``width`` × ``height`` image once turned."""
    return (height, width) if swaps_sides(orientation) else (width, height)


def turn(image: Any, orientation: int) -> Any:
    """``image`` (decoded) turned upright: a transposed copy, or itself for orientation 1."""
    if orientation not in TRANSPOSES:
        return image
    from PIL import Image

    return image.transpose(Image.Transpose[TRANSPOSES[orientation]])


def turned_box(box: Box, width: int, height: int, orientation: int) -> Box:
    """``box`` (left, top, right, bottom) of a ``width`` × ``height`` image → the same pixels'
    box once the image is turned (continuous coordinates, origin top-left)."""
    left, top, right, bottom = box
    if orientation == 2:
        return (width - right, top, width - left, bottom)
    if orientation == 3:
        return (width - right, height - bottom, width - left, height - top)
    if orientation == 4:
        return (left, height - bottom, right, height - top)
    if orientation == 5:  # transpose: (x, y) → (y, x)
        return (top, left, bottom, right)
    if orientation == 6:  # a quarter clockwise: (x, y) → (height - y, x)
        return (height - bottom, left, height - top, right)
    if orientation == 7:  # transverse: (x, y) → (height - y, width - x)
        return (height - bottom, width - right, height - top, width - left)
    if orientation == 8:  # a quarter counter-clockwise: (x, y) → (y, width - x)
        return (top, width - right, bottom, width - left)
    return box
