"""Image bytes → the model's input tensor, as the bundle's pipeline declares (in memory only).
The same code runs on the device (``/predict``) and on the host (validation at conversion).

The declared size is read from the image header and checked against the pipeline's
``max_pixels`` and the request's memory allowance before a single pixel is decoded, so a
decompression bomb (a small PNG declaring 50k × 50k) costs a header parse, not gigabytes. A
large JPEG is decoded scaled where the resize shrinks it anyway (``edgesdk/pipeline/draft.py``),
and charged the size it is decoded at.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from edgesdk.pipeline.draft import Decoding
from edgesdk.pipeline.errors import PipelineInputError
from edgesdk.pipeline.geometry import crop_origin, placement
from edgesdk.pipeline.orientation import read_orientation, turn
from edgesdk.schemas.pipeline import ImagePre, Resize

#: Media type → the one Pillow decoder allowed for it (no other format's parser ever runs).
IMAGE_FORMATS = {"image/jpeg": "JPEG", "image/png": "PNG"}

#: Scans a JPEG may hold: libjpeg's progressive scripts use at most 10, and each scan re-reads
#: every block, so repeating one 31-byte scan 1000 times made a 94 kB JPEG cost 9.5 s of CPU in
#: the decoder (16 MiB of them: hours), in C, where no request timeout stops it.
MAX_JPEG_SCANS = 100


def open_image(data: bytes, media_type: str, max_pixels: int) -> Any:
    """A lazily decoded Pillow image of ``data`` (only its header read), its size checked."""
    try:
        from PIL import UnidentifiedImageError
    except ImportError:  # the agent's own install stays light: the decoder is the pipeline extra
        raise PipelineInputError(
            501, "this install has no image decoder: install it with pip install 'edgesdk[pipeline]' (Pillow)"
        ) from None

    fmt = IMAGE_FORMATS.get(media_type)
    if fmt is None:
        raise PipelineInputError(
            415, f"Content-Type {media_type!r} is not an image this model takes; use image/jpeg or image/png"
        )
    scans = data.count(b"\xff\xda") if fmt == "JPEG" else 0  # SOS markers (an 0xFF in entropy data is FF 00)
    if scans > MAX_JPEG_SCANS:
        raise PipelineInputError(
            413,
            f"JPEG has {scans} scans, over the {MAX_JPEG_SCANS} decoded; re-encode it (baseline or standard progressive)",
        )
    try:
        image = _parse_header(data, fmt)
    except UnidentifiedImageError:  # Pillow's text names a BytesIO object; say what the body looks like
        magic = {"image/jpeg": b"\xff\xd8\xff", "image/png": b"\x89PNG"}
        like = next((kind for kind, start in magic.items() if data.startswith(start)), None)
        hint = f"; the body starts like {like}: send Content-Type: {like}" if like and like != media_type else ""
        raise PipelineInputError(400, f"not a valid {fmt} image (Pillow cannot identify it){hint}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise PipelineInputError(400, f"not a valid {fmt} image: {exc}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise PipelineInputError(
            413,
            f"image declares {width}x{height} = {width * height} pixels; this model's pipeline allows {max_pixels} "
            "(its image.max_pixels): send a smaller image",
        )
    return image


def _parse_header(data: bytes, fmt: str) -> Any:
    """Pillow's parser of ``fmt`` run on ``data``: its header read, nothing decoded. Called as
    ``Image.open`` calls it but without the bomb check ``Image.open`` runs next, whose error
    (past 2 x ``Image.MAX_IMAGE_PIXELS``, 179 MP: "could be decompression bomb DOS attack")
    spoke before our ``max_pixels`` line naming the pipeline's limit; our bound is lower (at
    most 100 MP, ``edgesdk.schemas.pipeline.MAX_PIXELS_CAP``) and checked next, before decoding."""
    import struct

    from PIL import Image, UnidentifiedImageError

    Image.preinit()  # registers the JPEG and PNG parsers
    parser, accept = Image.OPEN[fmt]
    accepted = accept is None or accept(data[:16])
    if not accepted or isinstance(accepted, str):  # a str: Pillow's warning that it is not this format
        raise UnidentifiedImageError(f"not {fmt}")
    try:
        return parser(io.BytesIO(data), "")
    except (SyntaxError, IndexError, TypeError, struct.error) as exc:  # what Image.open reads as "not this format"
        raise UnidentifiedImageError(f"not {fmt}") from exc


#: Bytes a pixel takes as Pillow decodes each mode (a mode not listed: 4).
MODE_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "LA": 2, "PA": 2, "RGB": 3, "YCbCr": 3, "LAB": 3}


def decoded_nbytes(image: Any, pre: ImagePre, decoding: Decoding | None = None) -> int:
    """Bytes this image will take once decoded at ``image.size`` (after ``draft.draft``: the
    scaled size) in its own mode (4 a pixel for CMYK or RGBA), its copy in the pipeline's
    colour, a progressive JPEG's coefficients (2 bytes a sample of the declared size: libjpeg
    buffers them whole at any scale), its turned copy where EXIF says to turn it, plus its
    float32 tensor and one working copy at the final size; charged to the request's allowance
    before decoding (8 CMYK JPEGs charged as grey grew the agent by 456 MB)."""
    width, height = image.size
    decoding = decoding or unscaled(image, pre)
    declared = decoding.width * decoding.height
    channels = 1 if pre.color == "L" else 3
    source = MODE_BYTES.get(image.mode, 4)
    converted = channels if image.mode != ("L" if pre.color == "L" else "RGB") else 0
    turned = channels if decoding.orientation != 1 else 0  # the transpose is a copy in the pipeline's colour
    coefficients = 2 * len(image.getbands()) * declared if image.info.get("progressive") else 0
    final = pre.center_crop or pre.resize
    out_h, out_w = (final.height, final.width) if final is not None else (height, width)
    return width * height * (source + converted + turned) + coefficients + out_h * out_w * channels * 4 * 2


def unscaled(image: Any, pre: ImagePre) -> Decoding:
    """The decoding of an image decoded whole (no ``draft.draft``), turned as its EXIF says."""
    return Decoding(image.width, image.height, orientation=read_orientation(image, pre))


def to_tensor(
    image: Any, pre: ImagePre, dtype: np.dtype[Any], normalize: bool = True, decoding: Decoding | None = None
) -> np.ndarray:
    """Decode ``image`` and run the pipeline's image steps, in their fixed order; a batch of one.
    ``normalize=False``: the model's graph does ``scale``, ``mean`` and ``std`` (folded in).
    ``decoding``: ``draft.draft``'s, where the image is decoded scaled. The decoded image is
    turned upright (its EXIF orientation) before the steps, as ``ImageOps.exif_transpose`` is
    called before them in the usual Python loop."""
    from PIL import Image

    decoding = decoding or unscaled(image, pre)
    mode = "L" if pre.color == "L" else "RGB"
    try:
        image.load()  # decodes here
        if image.mode != mode:  # converting to its own mode would copy every pixel for nothing
            image = image.convert(mode)
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
        raise PipelineInputError(400, f"cannot decode the image: {exc}") from None
    upright = decoding.upright(image.width, image.height)
    image = turn(image, decoding.orientation)
    if pre.resize is not None:
        image = resize(image, pre.resize, upright)
    if pre.center_crop is not None:
        left, top = crop_origin(image.width, image.height, pre.center_crop)
        image = image.crop((left, top, left + pre.center_crop.width, top + pre.center_crop.height))
    return pixels_to_tensor(np.asarray(image), pre, dtype, normalize)


def resize(image: Any, step: Resize, decoding: Decoding | None = None) -> Any:
    """``image`` resized as ``step`` says: stretched, or letterboxed onto a ``fill`` canvas
    (where ``geometry.placement`` puts it, the frame boxes are mapped back through). A scaled
    decode (``decoding``) is placed by the declared size, and its ``box`` is what is resized."""
    from PIL import Image

    decoding = decoding or Decoding(image.width, image.height)
    placed = placement(decoding.width, decoding.height, step)
    filter_ = Image.Resampling[step.interpolation.upper()]
    image = image.resize((placed.width, placed.height), resample=filter_, box=decoding.box)
    if step.letterbox is None:
        return image
    fill = step.letterbox.fill if image.mode == "L" else (step.letterbox.fill,) * 3
    canvas = Image.new(image.mode, (placed.canvas_width, placed.canvas_height), fill)
    canvas.paste(image, (placed.left, placed.top))
    return canvas


def pixels_to_tensor(pixels: np.ndarray, pre: ImagePre, dtype: np.dtype[Any], normalize: bool) -> np.ndarray:
    """(H, W[, C]) uint8 pixels → the model's (1, ...) tensor in one pass over the pixels: the
    colour order and layout are views, and ``x * scale``, ``- mean``, ``/ std`` are one
    multiply-add (``x * a + b``, the constants a folded graph holds) written straight into the
    contiguous result. The obvious numpy (a float copy, three temporaries, then a transposing
    copy) cost 1.4 ms on a 224 x 224 photo; this, 0.25 ms."""
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pre.color == "BGR":
        pixels = pixels[:, :, ::-1]
    channels_first = pre.layout == "NCHW"
    view = pixels.transpose(2, 0, 1) if channels_first else pixels
    if not normalize:  # the graph normalizes: pixels as they are (uint8 stays uint8 for a folded cast)
        tensor = np.empty((1, *view.shape), dtype if dtype == np.uint8 else np.float32)
        tensor[0] = view
        return cast(tensor, dtype)
    gain, bias = normalize_affine(pre)
    per_channel = (-1, 1, 1) if channels_first else (-1,)
    tensor = np.empty((1, *view.shape), np.float32)
    np.multiply(view, gain.reshape(per_channel), out=tensor[0])
    tensor[0] += bias.reshape(per_channel)
    return cast(tensor, dtype)


def normalize_affine(pre: ImagePre) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``a`` and ``b`` per channel with ``x * a + b == (x * scale - mean) / std``, made
    in float64 first as converters/graph_fold.py makes a folded graph's (the same numbers)."""
    mean, std = np.broadcast_arrays(np.asarray(pre.mean, np.float64), np.asarray(pre.std, np.float64))
    return (pre.scale / std).astype(np.float32), (-mean / std).astype(np.float32)


def cast(tensor: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """To the model's public input dtype; integers rounded and clipped to their range (a
    quantized variant's own scale/zero point are applied by the server, as for tensor routes)."""
    if tensor.dtype == dtype:
        return tensor
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.rint(tensor), info.min, info.max).astype(dtype)
    return tensor.astype(dtype, copy=False)
