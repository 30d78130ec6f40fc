"""A phone photo reaches the model the right way up (issue 42): the pipeline turns a JPEG or PNG
as its EXIF Orientation says, as ``PIL.ImageOps.exif_transpose`` does in the usual Python loop,
before its steps; the scaled (draft) decode asks for the turned sides; the turned copy is
charged; boxes map back to the turned image's pixels; ``image.exif_orientation: false`` feeds
the image as stored; and EXIF blocks Pillow cannot read, or values other than 1-8, are ignored."""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
import pytest

from edgesdk.errors import SchemaError
from edgesdk.schemas.pipeline import Pipeline

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
from PIL import ImageOps  # noqa: E402

from edgesdk.pipeline import Limits, prepare  # noqa: E402


class _Input:
    name = "image"
    dtype = "float32"


def _picture(width: int = 24, height: int = 14) -> Image.Image:
    """An asymmetric RGB picture: every turn and flip of it is a different array."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x * 7 + y * 13) % 256], axis=-1).astype(np.uint8)
    pixels[: height // 3, : width // 4] = 255  # a white corner block
    return Image.fromarray(pixels)


def _tiff(entries: list[tuple[int, int, int, bytes]], *, next_ifd: int = 0, count: int | None = None) -> bytes:
    """An EXIF block (APP1 payload): a little-endian TIFF header and one IFD of
    ``(tag, type, count, 4 value bytes)`` entries."""
    head = b"II*\x00" + struct.pack("<I", 8)
    ifd = struct.pack("<H", len(entries) if count is None else count)
    ifd += b"".join(struct.pack("<HHI", tag, kind, n) + value for tag, kind, n, value in entries)
    return b"Exif\x00\x00" + head + ifd + struct.pack("<I", next_ifd)


def _orientation_exif(value: int) -> bytes:
    return _tiff([(0x0112, 3, 1, struct.pack("<HH", value, 0))])


def _encoded(picture: Image.Image, fmt: str = "JPEG", exif: bytes | None = None) -> bytes:
    buffer = io.BytesIO()
    options: dict[str, Any] = {"quality": 95} if fmt == "JPEG" else {}
    if exif is not None:
        options["exif"] = exif if fmt == "JPEG" else exif[6:]  # PNG's eXIf chunk holds the TIFF alone
    picture.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _pipeline(**image: Any) -> Pipeline:
    return Pipeline.model_validate({"image": {"scale": 1 / 255, "layout": "NHWC", **image}})


def _reference(data: bytes, resize: tuple[int, int], crop: tuple[int, int] | None = None, turn: bool = True):
    """The usual Python loop: Pillow open, exif_transpose, RGB, resize, center crop, / 255."""
    image = Image.open(io.BytesIO(data))
    image = (ImageOps.exif_transpose(image) if turn else image).convert("RGB")
    image = image.resize(resize, Image.Resampling.BILINEAR)
    if crop is not None:
        left, top = (image.width - crop[0]) // 2, (image.height - crop[1]) // 2
        image = image.crop((left, top, left + crop[0], top + crop[1]))
    return (np.asarray(image, dtype=np.float32) * np.float32(1 / 255))[None]


def _tensor(pipeline: Pipeline, data: bytes, media_type: str = "image/jpeg") -> np.ndarray:
    return prepare(pipeline, data, media_type, [_Input()]).feeds["image"]


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_each_exif_orientation_gives_the_tensor_of_exif_transpose_and_the_same_steps(fmt: str, orientation: int):
    """Resized to a non-square 10 x 16 and center-cropped to 8 x 12: a sideways image or a
    mirrored one would give another array (before: every value but 1 did)."""
    data = _encoded(_picture(), fmt, _orientation_exif(orientation))
    pipeline = _pipeline(resize={"height": 16, "width": 10}, center_crop={"height": 12, "width": 8})
    media = "image/jpeg" if fmt == "JPEG" else "image/png"
    np.testing.assert_allclose(_tensor(pipeline, data, media), _reference(data, (10, 16), (8, 12)), atol=1e-6)


def test_exif_orientation_false_feeds_the_image_as_stored() -> None:
    data = _encoded(_picture(), exif=_orientation_exif(6))
    pipeline = _pipeline(resize={"height": 16, "width": 10}, exif_orientation=False)
    np.testing.assert_allclose(_tensor(pipeline, data), _reference(data, (10, 16), turn=False), atol=1e-6)


def test_exif_orientation_is_left_out_of_the_manifest_unless_set_and_a_bad_value_is_refused() -> None:
    """Unset, the signed pipeline (and its hash) is what it was, so older agents still read it."""
    assert "exif_orientation" not in Pipeline().model_dump_json(exclude_none=True)
    assert '"exif_orientation":false' in _pipeline(exif_orientation=False).model_dump_json(exclude_none=True)
    with pytest.raises(SchemaError, match="exif_orientation"):
        Pipeline.parse_obj_clear({"image": {"exif_orientation": "sideways"}}, source="pipeline.yaml")


@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_box_turned_with_the_image_covers_the_same_pixels(orientation: int) -> None:
    from edgesdk.pipeline.orientation import TRANSPOSES, turned_box

    picture, box = _picture(24, 14), (3, 2, 11, 13)
    turned = ImageOps.exif_transpose(Image.open(io.BytesIO(_encoded(picture, "PNG", _orientation_exif(orientation)))))
    moved = tuple(int(v) for v in turned_box(box, 24, 14, orientation))
    expected = picture.crop(box)
    if orientation in TRANSPOSES:
        expected = expected.transpose(Image.Transpose[TRANSPOSES[orientation]])
    assert np.array_equal(np.asarray(turned.crop(moved)), np.asarray(expected))


def test_boxes_map_back_to_the_pixels_of_the_turned_image() -> None:
    """A 64 x 32 stored landscape with orientation 6 is a 32 x 64 portrait: the box frame is
    the portrait's, and the model input's left half is the portrait's left half."""
    data = _encoded(_picture(64, 32), exif=_orientation_exif(6))
    frame = prepare(_pipeline(resize={"height": 16, "width": 16}), data, "image/jpeg", [_Input()]).frame
    assert frame is not None
    assert frame.describe() | {"width": 32, "height": 64} == frame.describe()  # before: 64 x 32
    assert frame.to_image(np.array([[0.0, 0.0, 8.0, 16.0]])).tolist() == [[0.0, 0.0, 16.0, 64.0]]


def _charged(pipeline: Pipeline, data: bytes) -> tuple[int, np.ndarray]:
    charges: list[int] = []
    feeds = prepare(pipeline, data, "image/jpeg", [_Input()], Limits(lambda size, what: charges.append(size))).feeds
    return sum(charges), feeds["image"]


def test_the_turned_copy_is_charged() -> None:
    picture = _picture(40, 30)
    upright, _ = _charged(_pipeline(), _encoded(picture, exif=_orientation_exif(1)))
    turned, tensor = _charged(_pipeline(), _encoded(picture, exif=_orientation_exif(8)))
    assert tensor.shape == (1, 40, 30, 3)
    assert turned - upright == 40 * 30 * 3  # the transpose's RGB copy


def test_a_scaled_decode_asks_for_the_turned_sides() -> None:
    """1600 x 800 stored, orientation 6: a 800 x 1600 portrait resized to 50 wide, 100 high.
    The decoder is asked for 2 x that in the stored sides (200 x 100): 1/8 scale; asking in the
    portrait's sides (100 x 200) would decode at 1/4 (400 x 200), charged 4 times the pixels."""
    data = _encoded(_picture(1600, 800), exif=_orientation_exif(6))
    pipeline = _pipeline(resize={"height": 100, "width": 50})
    charged, tensor = _charged(pipeline, data)
    tensors = 50 * 100 * 3 * 4 * 2
    assert charged == 200 * 100 * (3 + 3) + tensors  # decoded at 1/8, and its turned copy
    expected = Image.open(io.BytesIO(data))
    expected.draft(None, (200, 100))
    expected = ImageOps.exif_transpose(expected).convert("RGB").resize((50, 100), Image.Resampling.BILINEAR)
    np.testing.assert_allclose(tensor, (np.asarray(expected, np.float32) * np.float32(1 / 255))[None], atol=1e-6)


def test_a_scaled_decode_of_a_side_not_a_multiple_of_8_keeps_the_turned_geometry() -> None:
    """1605 x 803 at 1/8 is 200.6 x 100.4 pixels, rounded up to 201 x 101: after the turn the
    part that is the photo sits at the other corner; resizing it gives what a full decode does,
    a few grey levels apart (a scaled decode averages blocks)."""
    data = _encoded(_picture(1605, 803), exif=_orientation_exif(6))
    scaled, whole = _tensor(_pipeline(resize={"height": 100, "width": 50}), data), _reference(data, (50, 100))
    assert scaled.shape == whole.shape == (1, 100, 50, 3)
    assert np.abs(scaled - whole).mean() < 0.01 and np.abs(scaled - whole).max() < 0.1


def test_a_png_whose_exif_text_is_not_hex_is_served_as_stored() -> None:
    """ImageMagick's "Raw profile type exif" text chunk, its hex broken: exif_transpose itself
    raises ValueError on it; the pipeline ignores the block (without its catch: a 500)."""
    from PIL import PngImagePlugin

    text = PngImagePlugin.PngInfo()
    text.add_text("Raw profile type exif", "\nexif\n      10\nzz-not-hex\n")
    buffer = io.BytesIO()
    _picture().save(buffer, format="PNG", pnginfo=text)
    data = buffer.getvalue()
    with pytest.raises(ValueError, match="hexadecimal"):
        ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    pipeline = _pipeline(resize={"height": 16, "width": 10})
    np.testing.assert_allclose(_tensor(pipeline, data, "image/png"), _reference(data, (10, 16), turn=False), atol=1e-6)


def _xmp_jpeg(value: bytes) -> bytes:
    """A JPEG with no EXIF and an XMP packet saying tiff:Orientation (Pillow reads it too)."""
    data = _encoded(_picture())
    packet = b"http://ns.adobe.com/xap/1.0/\x00" + b'<x:xmpmeta><rdf:Description tiff:Orientation="' + value + b'"/>'
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(packet) + 2) + packet + data[2:]


def _hostile_exif() -> dict[str, bytes]:
    return {
        "orientation 0": _orientation_exif(0),
        "orientation 9": _orientation_exif(9),
        "orientation 65535": _orientation_exif(65535),
        "orientation as text": _tiff([(0x0112, 2, 4, b"six\x00")]),
        "orientation with no value": _tiff([(0x0112, 3, 0, b"\x00" * 4)]),
        "orientation far past the block": _tiff([(0x0112, 3, 1_000_000, struct.pack("<I", 0xFFFFFF00))]),
        "truncated": _orientation_exif(6)[:16],
        "not a TIFF": b"Exif\x00\x00" + b"\x00" * 40,
        "65535 entries declared, no orientation among them": _tiff([(0x010F, 2, 4, b"cam\x00")], count=65535),
        "an IFD that points to itself": _tiff([(0x8769, 4, 1, struct.pack("<I", 8))], next_ifd=8),
        "60 kB of noise": b"Exif\x00\x00II*\x00\x08\x00\x00\x00" + np.random.default_rng(5).bytes(60_000),
    }


@pytest.mark.parametrize("name", sorted(_hostile_exif()))
def test_an_exif_block_pillow_cannot_use_is_ignored_and_the_image_served_as_stored(name: str) -> None:
    data = _encoded(_picture(), exif=_hostile_exif()[name])
    pipeline = _pipeline(resize={"height": 16, "width": 10})
    np.testing.assert_allclose(_tensor(pipeline, data), _reference(data, (10, 16), turn=False), atol=1e-6)


def test_an_xmp_orientation_or_one_before_a_cut_turns_the_image_as_exif_transpose_does() -> None:
    """Pillow reads XMP's tiff:Orientation where EXIF has none, and keeps the entries it read
    before a block's cut: so does the pipeline, so the user's own code and the agent agree."""
    pipeline = _pipeline(resize={"height": 16, "width": 10})
    cut = _encoded(_picture(), exif=_tiff([(0x0112, 3, 1, struct.pack("<HH", 6, 0))], count=65535))
    for turned in (_xmp_jpeg(b"6"), cut):
        assert ImageOps.exif_transpose(Image.open(io.BytesIO(turned))).size == (14, 24)
        np.testing.assert_allclose(_tensor(pipeline, turned), _reference(turned, (10, 16)), atol=1e-6)
    stored = _xmp_jpeg(b"0")
    np.testing.assert_allclose(_tensor(pipeline, stored), _reference(stored, (10, 16), turn=False), atol=1e-6)


hypothesis = pytest.importorskip("hypothesis", reason="hypothesis not installed (the dev extra installs it)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgesdk.pipeline import PipelineInputError  # noqa: E402

SMALL = _encoded(_picture(12, 8))
FUZZ_PIPELINE = _pipeline(resize={"height": 6, "width": 4})


@st.composite
def mutated_exif(draw: st.DrawFn) -> bytes:
    """An EXIF block with an orientation entry and another, its bytes flipped, cut or grown."""
    entries = [(0x0112, 3, 1, struct.pack("<HH", draw(st.integers(0, 65535)), 0))]
    entries.append(
        (draw(st.integers(0, 65535)), draw(st.integers(0, 20)), draw(st.integers(0, 2**32 - 1)), b"\x08\0\0\0")
    )
    block = bytearray(_tiff(entries, next_ifd=draw(st.sampled_from([0, 8, 2**32 - 1]))))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(6, len(block) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            block[at] ^= draw(st.integers(1, 255))
        elif action == "cut":
            del block[at:]
            break
        else:
            block[at:at] = draw(st.binary(min_size=1, max_size=64))
    return bytes(block)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_exif())
def test_any_exif_block_gives_a_tensor_of_the_pipelines_shape_or_a_4xx(block: bytes) -> None:
    data = SMALL[:2] + b"\xff\xe1" + struct.pack(">H", len(block) + 2) + block + SMALL[2:]
    try:
        tensor = _tensor(FUZZ_PIPELINE, data)
    except PipelineInputError as exc:
        assert 400 <= exc.status < 500, exc
        return
    assert tensor.shape == (1, 6, 4, 3) and tensor.dtype == np.float32
