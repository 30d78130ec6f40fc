"""A phone's portrait photo at a real agent's ``/predict`` (issue 42): a phone stores it landscape
with EXIF Orientation 6; the agent (``edge-agent run``, the digits CNN packaged by the real CLI
with its default pipeline, the fixture of test_predict_phone_photo.py) turns it upright as
``PIL.ImageOps.exif_transpose`` does and answers the label of the upright photo and of the usual
Python loop. Before, the model saw the digit sideways. Hostile EXIF blocks are answered as the
image stored, never a 500."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from tests.integration.test_predict_phone_photo import (  # noqa: F401 - fixtures
    LABELS,
    _post,
    default_cap_agent,
    digits_convert_dir,
)

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
ort = pytest.importorskip("onnxruntime")
from PIL import ImageOps, PngImagePlugin  # noqa: E402


def _exif(tag: int, value: int, next_ifd: int = 0) -> bytes:
    """An EXIF block (little-endian TIFF) of one IFD holding one SHORT or LONG entry."""
    kind, packed = (3, struct.pack("<HH", value, 0)) if tag == 0x0112 else (4, struct.pack("<I", value))
    entry = struct.pack("<HHI", tag, kind, 1) + packed
    return b"Exif\x00\x00II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + entry + struct.pack("<I", next_ifd)


#: Orientation 6: "turn a quarter clockwise to show it" (a phone held upright).
ORIENTATION_6 = _exif(0x0112, 6)


def _jpeg(picture: Image.Image, exif: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=90, exif=exif)
    return buffer.getvalue()


def _portraits(digits, count: int) -> list[Image.Image]:
    """Test digits drawn upright on a 600 x 800 portrait, as a phone shows the photo."""
    portraits = []
    for image in np.load(digits.validation)["image"][:count, 0]:
        pixels = np.rint(image * 255).astype(np.uint8)
        portraits.append(Image.fromarray(pixels).resize((600, 800), Image.Resampling.BILINEAR).convert("RGB"))
    return portraits


def _users_label(digits, jpeg: bytes) -> str:
    """The usual Python loop: Pillow open, exif_transpose, grey, resize, / 255, onnxruntime."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(jpeg))).convert("L").resize((8, 8), Image.Resampling.BILINEAR)
    x = (np.asarray(image, dtype=np.float32) / 255.0)[None, None]
    session = ort.InferenceSession(str(digits.onnx), providers=["CPUExecutionProvider"])
    return LABELS[int(np.argmax(session.run(None, {session.get_inputs()[0].name: x})[0]))]


def _label(agent, body: bytes, content_type: str = "image/jpeg") -> str:
    answered = _post(agent, body, content_type)
    assert answered.status_code == 200, answered.text
    return answered.json()["labels"][0]["label"]


def test_a_portrait_phone_photo_stored_landscape_gets_the_label_of_the_upright_photo(
    default_cap_agent,  # noqa: F811 - the imported fixture
    digits,
) -> None:
    sideways_labels = []
    for portrait in _portraits(digits, 10):
        upright = _jpeg(portrait)
        stored = _jpeg(portrait.transpose(Image.Transpose.ROTATE_90), ORIENTATION_6)  # 800 x 600, as the sensor read it
        assert Image.open(io.BytesIO(stored)).size == (800, 600)
        label = _label(default_cap_agent, stored)
        assert label == _label(default_cap_agent, upright) == _users_label(digits, stored), label
        sideways_labels.append(label)
    assert len(set(sideways_labels)) > 3  # real digits, told apart


def _png_with_broken_exif_text(picture: Image.Image) -> bytes:
    """ImageMagick's "Raw profile type exif" text chunk with broken hex: exif_transpose raises on it."""
    text = PngImagePlugin.PngInfo()
    text.add_text("Raw profile type exif", "\nexif\n      10\nzz-not-hex\n")
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", pnginfo=text)
    return buffer.getvalue()


def test_hostile_exif_blocks_are_answered_as_the_image_stored(default_cap_agent, digits) -> None:  # noqa: F811
    portrait = _portraits(digits, 1)[0]
    expected = _label(default_cap_agent, _jpeg(portrait))
    blocks = [
        _exif(0x0112, 9),  # no such orientation
        _exif(0x0112, 0, next_ifd=8),  # and the next IFD is itself
        _exif(0x8769, 8),  # the EXIF sub-IFD is IFD0 itself
        _exif(0x0112, 6)[:18],  # cut inside its one entry
        b"Exif\x00\x00MM\x00*" + bytes(np.random.default_rng(7).integers(0, 256, 60_000, dtype=np.uint8)),
    ]
    for block in blocks:
        assert _label(default_cap_agent, _jpeg(portrait, block)) == expected
    assert _label(default_cap_agent, _png_with_broken_exif_text(portrait), "image/png") == expected
    assert default_cap_agent.proc.poll() is None
    assert "Traceback" not in default_cap_agent.log(), default_cap_agent.log()[-3000:]
