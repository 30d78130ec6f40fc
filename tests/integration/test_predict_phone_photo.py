"""A phone-sized photo at ``/predict`` under the agent's default memory cap: a real ``edge-agent
run`` serves the digits CNN with a pipeline packaged by the real CLI (its default
``max_pixels``, 16 MP; ``api.max_decoded_bytes`` left at its default, 16 MiB). A 4000 x 3000
RGB JPEG (36 MB of pixels) is decoded at 1/8 for the 8 x 8 resize and answered with the label
the usual full decode gives; before, it was a 413. And an image past Pillow's own bomb limit
gets the agent's 413 naming the pipeline's ``image.max_pixels``."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest

from tests.agent_helpers import PROFILE, AgentProcess, agent_env, make_device
from tests.integration.test_agent_predict import (  # noqa: F401 - digits_convert_dir is a fixture
    LABELS,
    _installed,
    _png_declaring,
    _reference_label,
    digits_convert_dir,
)

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
httpx = pytest.importorskip("httpx")

#: The digits pipeline of test_agent_predict.py with the default max_pixels (16 MP).
PIPELINE_YAML = """\
input: image
image:
  color: L
  resize: {height: 8, width: 8, interpolation: bilinear}
  scale: 0.00392156862745098
"""


@pytest.fixture(scope="module")
def default_cap_agent(digits_convert_dir, tmp_path_factory):  # noqa: F811 - the imported fixture
    device = make_device(tmp_path_factory.mktemp("predict-phone-photo"))
    root = device.root
    (root / "pipeline.yaml").write_text(PIPELINE_YAML)
    (root / "labels.txt").write_text("\n".join(LABELS) + "\n")
    bundle = root / "digits.edgepkg"
    packaged = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "package", str(digits_convert_dir), "--name", "digits"]
        + ["--version", "1.0.0", "--publisher-key", str(device.publisher_key), "--recipient", str(device.device_pub)]
        + ["--target", PROFILE, "--pipeline", str(root / "pipeline.yaml"), "--labels", str(root / "labels.txt")]
        + ["--out", str(bundle)],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=120,
    )
    assert packaged.returncode == 0, packaged.stderr
    _installed(device, bundle)
    assert "max_decoded_bytes" not in device.settings["api"]  # the default cap
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()


def _phone_photos(digits, count: int) -> list[bytes]:
    """Test digits drawn at 4000 x 3000 in RGB, saved as a camera saves them (baseline JPEG)."""
    encoded = []
    for image in np.load(digits.validation)["image"][:count, 0]:
        pixels = np.rint(image * 255).astype(np.uint8)
        photo = Image.fromarray(pixels).resize((4000, 3000), Image.Resampling.BILINEAR).convert("RGB")
        buffer = io.BytesIO()
        photo.save(buffer, format="JPEG", quality=90)
        encoded.append(buffer.getvalue())
    return encoded


def _post(agent: AgentProcess, body: bytes, content_type: str) -> httpx.Response:
    return httpx.post(
        f"{agent.url}/v1/models/digits/predict", content=body, headers={"Content-Type": content_type}, timeout=60
    )


def test_a_12_mp_phone_jpeg_is_answered_under_the_default_cap_with_the_label_of_a_full_decode(
    default_cap_agent, digits
) -> None:
    for photo in _phone_photos(digits, 3):
        answered = _post(default_cap_agent, photo, "image/jpeg")
        assert answered.status_code == 200, answered.text  # before: 413, 48 MB charged (36 MB RGB + its grey copy)
        assert answered.json()["labels"][0]["label"] == LABELS[_reference_label(digits, photo)], answered.text


def test_an_image_past_pillows_bomb_limit_gets_the_413_naming_image_max_pixels(default_cap_agent) -> None:
    """Before: 'image refused before decoding: Image size (3600000000 pixels) exceeds limit of
    178956970 pixels, could be decompression bomb DOS attack.' (Pillow's, naming no knob)."""
    refused = _post(default_cap_agent, _png_declaring(60_000, 60_000), "image/png")
    assert refused.status_code == 413, refused.text
    error = refused.json()["error"]
    assert "60000x60000 = 3600000000 pixels" in error and "allows 16000000 (its image.max_pixels)" in error, error
    assert "DOS attack" not in error
    assert default_cap_agent.proc.poll() is None
