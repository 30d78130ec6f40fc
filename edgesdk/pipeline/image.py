"""Image bytes → the model's input tensor, as the bundle's pipeline declares (in memory only).
The same code runs on the device (``/predict``) and on the host (validation at conversion).

The declared size is read from the image header and checked against the pipeline's
``max_pixels`` and the request's memory allowance before a single pixel is decoded, so a
decompression bomb (a small PNG declaring 50k × 50k) costs a header parse, not gigabytes.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.schemas.pipeline import ImagePre

#: Media type → the one Pillow decoder allowed for it (no other format's parser ever runs).
IMAGE_FORMATS = {"image/jpeg": "JPEG", "image/png": "PNG"}


def open_image(data: bytes, media_type: str, max_pixels: int) -> Any:
    """A lazily decoded Pillow image of ``data`` (only its header read), its size checked."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:  # the agent's own install stays light: the decoder is the pipeline extra
        raise PipelineInputError(
            501, "this install has no image decoder: install it with pip install 'edgesdk[pipeline]' (Pillow)"
        ) from None

    fmt = IMAGE_FORMATS.get(media_type)
    if fmt is None:
        raise PipelineInputError(
            415, f"Content-Type {media_type!r} is not an image this model takes; use image/jpeg or image/png"
        )
    try:
        image = Image.open(io.BytesIO(data), formats=[fmt])
    except Image.DecompressionBombError as exc:  # Pillow's own bound, far above ours: still a bomb
        raise PipelineInputError(413, f"image refused before decoding: {exc}") from None
    except UnidentifiedImageError as exc:
        raise PipelineInputError(400, f"not a valid {fmt} image: {exc}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise PipelineInputError(400, f"not a valid {fmt} image: {exc}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise PipelineInputError(
            413, f"image declares {width}x{height} = {width * height} pixels; this model's pipeline allows {max_pixels}"
        )
    return image


def decoded_nbytes(image: Any, pre: ImagePre) -> int:
    """Bytes this image will take once decoded (8-bit pixels) plus its float32 tensor and one
    working copy at the final size; charged to the request's allowance before decoding."""
    width, height = image.size
    channels = 1 if pre.color == "L" else 3
    final = pre.center_crop or pre.resize
    out_h, out_w = (final.height, final.width) if final is not None else (height, width)
    return width * height * channels + out_h * out_w * channels * 4 * 2


def to_tensor(image: Any, pre: ImagePre, dtype: np.dtype[Any], normalize: bool = True) -> np.ndarray:
    """Decode ``image`` and run the pipeline's image steps, in their fixed order; a batch of one.
    ``normalize=False``: the model's graph does ``scale``, ``mean`` and ``std`` (folded in)."""
    from PIL import Image

    mode = "L" if pre.color == "L" else "RGB"
    try:
        image = image.convert(mode)  # decodes here
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
        raise PipelineInputError(400, f"cannot decode the image: {exc}") from None
    if pre.resize is not None:
        filters = Image.Resampling
        image = image.resize((pre.resize.width, pre.resize.height), resample=filters[pre.resize.interpolation.upper()])
    if pre.center_crop is not None:
        image = center_crop(image, pre.center_crop.height, pre.center_crop.width)
    # A graph that normalizes and casts (folded: [normalize, cast]) takes the decoder's uint8 as is.
    pixels: np.ndarray = np.asarray(image, dtype=np.uint8 if not normalize and dtype == np.uint8 else np.float32)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pre.color == "BGR":
        pixels = pixels[:, :, ::-1]
    if normalize:
        pixels = pixels * np.float32(pre.scale)
        pixels = (pixels - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    if pre.layout == "NCHW":
        pixels = pixels.transpose(2, 0, 1)
    return cast(np.ascontiguousarray(pixels[None]), dtype)


def center_crop(image: Any, height: int, width: int) -> Any:
    """The central ``height`` × ``width`` of ``image`` (422 when the image is smaller)."""
    full_w, full_h = image.size
    if height > full_h or width > full_w:
        raise PipelineInputError(422, f"image is {full_w}x{full_h}, smaller than the center crop {width}x{height}")
    left, top = (full_w - width) // 2, (full_h - height) // 2
    return image.crop((left, top, left + width, top + height))


def cast(tensor: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """To the model's public input dtype; integers rounded and clipped to their range (a
    quantized variant's own scale/zero point are applied by the server, as for tensor routes)."""
    if tensor.dtype == dtype:
        return tensor
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.rint(tensor), info.min, info.max).astype(dtype)
    return tensor.astype(dtype, copy=False)
