"""A large JPEG is decoded scaled (libjpeg's 1/2, 1/4, 1/8) where the pipeline's resize shrinks
it anyway, and the request is charged what is decoded; the geometry stays the declared image's.
And an image past Pillow's own bomb limit gets our 413 naming ``image.max_pixels``."""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from typing import Any

import numpy as np
import pytest

from edgesdk.schemas.pipeline import Pipeline

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")

from edgesdk.pipeline import Limits, PipelineInputError, prepare  # noqa: E402
from edgesdk.pipeline.image import open_image  # noqa: E402


class _Input:
    name = "image"
    dtype = "float32"


def _scene(width: int, height: int, *, mode: str = "RGB") -> Image.Image:
    """A smooth picture with edges (gradients and a disc), drawn small and scaled up, so that
    a JPEG of it is as cheap to make as a photo of that size is not."""
    small_w, small_h = 160, 120
    y, x = np.mgrid[0:small_h, 0:small_w]
    disc = ((x - 60) ** 2 + (y - 50) ** 2 < 30**2) * 120
    pixels = np.stack([x * 1.5, y * 2.0, 255 - x - y / 2 + disc], axis=-1).clip(0, 255).astype(np.uint8)
    return Image.fromarray(pixels).resize((width, height), Image.Resampling.BILINEAR).convert(mode)


def _jpeg(picture: Image.Image, **options: Any) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", **({"quality": 90} | options))
    return buffer.getvalue()


def _pipeline(**resize: Any) -> Pipeline:
    return Pipeline.model_validate({"image": {"resize": {"height": 224, "width": 224, **resize}, "scale": 1 / 255}})


def _charged(pipeline: Pipeline, data: bytes, media_type: str = "image/jpeg") -> tuple[int, np.ndarray]:
    """(bytes the request was charged before decoding, the model's tensor)."""
    charges: list[int] = []
    feeds = prepare(pipeline, data, media_type, [_Input()], Limits(lambda size, what: charges.append(size))).feeds
    (charged,) = charges
    return charged, feeds["image"]


#: The final tensor and one working copy (float32, 224 x 224 x 3), charged with any decode.
TENSOR_BYTES = 224 * 224 * 3 * 4 * 2


def test_a_phone_sized_jpeg_is_decoded_and_charged_at_a_quarter_of_its_sides() -> None:
    """4000 x 3000 for a 224 x 224 resize: decoded at 1000 x 750 (at least twice the resize on
    each side), 2.3 MB charged; every pixel would be 36 MB, over the default 16 MiB cap."""
    data = _jpeg(_scene(4000, 3000))
    picture = open_image(data, "image/jpeg", 16_000_000)
    from edgesdk.pipeline.draft import draft

    draft(picture, _pipeline().image)
    picture.load()
    assert picture.size == (1000, 750)  # what the decoder really made
    charged, tensor = _charged(_pipeline(), data)
    assert charged == 1000 * 750 * 3 + TENSOR_BYTES < 16 * 1024 * 1024
    whole, exact = _charged(_pipeline(draft=False), data)
    assert whole == 4000 * 3000 * 3 + TENSOR_BYTES > 16 * 1024 * 1024
    assert tensor.shape == exact.shape == (1, 3, 224, 224)
    difference = np.abs(tensor - exact) * 255  # in grey levels
    assert difference.mean() < 0.5 and difference.max() < 16, (difference.mean(), difference.max())


def test_a_scaled_decode_keeps_an_edge_where_the_whole_decode_puts_it() -> None:
    """137 px wide at 1/8 is 17.125 px: the scaled image's last pixel is mostly outside the
    photo, so its box (the 17.125), not all 17 pixels, is resized; all 17 moved the edge by
    37 grey levels."""
    pixels = np.zeros((129, 137, 3), np.uint8)
    pixels[:, 68:] = 255
    data = _jpeg(Image.fromarray(pixels), quality=95)
    digits = {"color": "L", "resize": {"height": 8, "width": 8}}
    charged, scaled = _charged(Pipeline.model_validate({"image": digits}), data)
    _, exact = _charged(
        Pipeline.model_validate({"image": digits | {"resize": {"height": 8, "width": 8, "draft": False}}}), data
    )
    assert charged == 18 * 17 * 3 + 8 * 8 * 4 * 2 + 18 * 17  # 1/8 scale; the grey copy
    assert np.abs(scaled - exact).max() <= 4


def test_a_scaled_decode_is_letterboxed_where_the_declared_size_places_it() -> None:
    """1000 x 350 fitted in 64 x 64 is 64 x 22 at row 21 (the frame boxes are mapped back
    through); its 1/4 decode, 250 x 88, would be placed 64 x 23 at row 20."""
    letterbox = {"height": 64, "width": 64, "letterbox": {"fill": 114}}
    data = _jpeg(_scene(1000, 350))
    charged, scaled = _charged(Pipeline.model_validate({"image": {"resize": letterbox}}), data)
    _, exact = _charged(Pipeline.model_validate({"image": {"resize": letterbox | {"draft": False}}}), data)
    assert charged == 250 * 88 * 3 + 64 * 64 * 3 * 4 * 2
    fill_rows = (exact[0, 0] == 114).all(axis=1)
    assert fill_rows.sum() == 64 - 22
    np.testing.assert_array_equal((scaled[0, 0] == 114).all(axis=1), fill_rows)
    assert np.abs(scaled - exact).mean() < 0.5


@pytest.mark.parametrize(
    ("resize", "media_type"),
    [({"interpolation": "nearest"}, "image/jpeg"), ({"draft": False}, "image/jpeg"), ({}, "image/png")],
    ids=["nearest-samples-pixels", "draft-false", "png-has-no-scaled-decode"],
)
def test_every_pixel_is_decoded_where_a_scaled_decode_would_change_the_answer_or_cannot_be(
    resize: dict[str, Any], media_type: str
) -> None:
    picture = _scene(1200, 900)
    buffer = io.BytesIO()
    picture.save(buffer, format=media_type.split("/")[1].upper())
    charged, _ = _charged(_pipeline(**resize), buffer.getvalue(), media_type)
    assert charged == 1200 * 900 * 3 + TENSOR_BYTES


def test_a_scaled_progressive_jpeg_is_still_charged_its_whole_coefficients() -> None:
    """libjpeg buffers a progressive JPEG's DCT coefficients for the whole image at any scale."""
    data = _jpeg(_scene(2000, 1500), progressive=True)
    charged, _ = _charged(_pipeline(), data)
    assert charged == 1000 * 750 * 3 + 2 * 3 * 2000 * 1500 + TENSOR_BYTES  # decoded at 1/2


def test_a_scaled_cmyk_jpeg_is_charged_its_four_bytes_and_rgb_copy_at_the_scaled_size() -> None:
    data = _jpeg(_scene(1200, 900, mode="CMYK"))
    assert _charged(_pipeline(), data)[0] == 600 * 450 * (4 + 3) + TENSOR_BYTES  # decoded at 1/2
    assert _charged(_pipeline(draft=False), data)[0] == 1200 * 900 * (4 + 3) + TENSOR_BYTES


def _png_declaring(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def _jpeg_declaring(width: int, height: int) -> bytes:
    """A small JPEG whose frame header (SOF0) is rewritten to declare ``width`` × ``height``."""
    data = bytearray(_jpeg(_scene(16, 16)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "media_type", "declared"),
    [
        (_png_declaring(60_000, 60_000), "image/png", "60000x60000 = 3600000000"),
        (_jpeg_declaring(65_000, 65_000), "image/jpeg", "65000x65000 = 4225000000"),
    ],
    ids=["png", "jpeg"],
)
def test_an_image_past_pillows_bomb_limit_gets_our_413_naming_max_pixels(
    data: bytes, media_type: str, declared: str
) -> None:
    """Pillow's own check (past 179 MP) spoke first: 'Image size (...) exceeds limit of
    178956970 pixels, could be decompression bomb DOS attack', naming no knob of ours."""
    with pytest.raises(PipelineInputError) as refused:
        open_image(data, media_type, max_pixels=1_000_000)
    assert refused.value.status == 413
    assert str(refused.value) == (
        f"image declares {declared} pixels; this model's pipeline allows 1000000 (its image.max_pixels): "
        "send a smaller image"
    )


def test_an_image_our_limit_allows_raises_no_pillow_bomb_warning() -> None:
    """100 MP (the largest max_pixels a pipeline may sign) is past Pillow's warning at 89 MP."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picture = open_image(_png_declaring(10_000, 10_000), "image/png", max_pixels=100_000_000)
    assert picture.size == (10_000, 10_000)
