"""``POST /v1/models/{name}/predict`` end to end: ``edgesdk package --pipeline --labels`` signs
the digits CNN's pre/post-processing into its bundle, a real ``edge-agent run`` process answers
real JPEGs with the label the usual Python code (Pillow + numpy + onnxruntime) gives, refuses a
corrupt JPEG and a decompression bomb with a 4xx, and keeps serving."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.agent_helpers import PROFILE, AgentProcess, agent_env, make_device, run_agent_cli

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
ort = pytest.importorskip("onnxruntime")
httpx = pytest.importorskip("httpx")

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
PIPELINE_YAML = """\
input: image
image:
  color: L
  resize: {height: 8, width: 8, interpolation: bilinear}
  scale: 0.00392156862745098   # 1/255: the digits CNN takes pixels in [0, 1]
  layout: NCHW
  max_pixels: 1000000
post:
  activation: softmax
  top_k: 3
"""


@pytest.fixture(scope="module")
def digits_convert_dir(digits, request):
    from tests.bundle_helpers import make_digits_convert_dir

    return make_digits_convert_dir(digits, Path(request.config.cache.mkdir("edgesdk-agent-digits-convert-v1")) / "out")


def _package_with_pipeline(device, convert_dir: Path, *, version: str, release: int, labels: list[str]) -> Path:
    """``edgesdk package --pipeline --labels`` (the real CLI) for ``device``; the bundle."""
    root = device.root
    (root / "pipeline.yaml").write_text(PIPELINE_YAML)
    (root / "labels.txt").write_text("\n".join(labels) + "\n")
    bundle = root / f"digits-{version}.edgepkg"
    packaged = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "package", str(convert_dir), "--name", "digits"]
        + ["--version", version, "--release", str(release), "--publisher-key", str(device.publisher_key)]
        + ["--recipient", str(device.device_pub), "--target", PROFILE, "--out", str(bundle)]
        + ["--pipeline", str(root / "pipeline.yaml"), "--labels", str(root / "labels.txt")],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=120,
    )
    assert packaged.returncode == 0, packaged.stderr
    return bundle


def _installed(device, bundle: Path) -> None:
    installed = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert installed.returncode == 0, installed.stderr


@pytest.fixture(scope="module")
def predict_agent(digits_convert_dir, tmp_path_factory):
    device = make_device(tmp_path_factory.mktemp("agent-predict"))
    _installed(device, _package_with_pipeline(device, digits_convert_dir, version="1.0.0", release=1, labels=LABELS))
    with AgentProcess(device) as running:
        yield running
        assert running.proc.poll() is None, running.log()


def _jpegs(digits, count: int) -> list[bytes]:
    """Real JPEG files of test digits, drawn 4x larger (so the pipeline's resize does work)."""
    images = np.load(digits.validation)["image"][:count, 0]
    encoded = []
    for image in images:
        pixels = np.rint(image * 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).resize((32, 32), Image.Resampling.NEAREST).save(buffer, format="JPEG", quality=90)
        encoded.append(buffer.getvalue())
    return encoded


def _reference_label(digits, jpeg: bytes) -> int:
    """The usual Python loop: Pillow decode and resize, numpy normalize, onnxruntime, argmax."""
    image = Image.open(io.BytesIO(jpeg)).convert("L").resize((8, 8), Image.Resampling.BILINEAR)
    x = (np.asarray(image, dtype=np.float32) / 255.0)[None, None]
    session = ort.InferenceSession(str(digits.onnx), providers=["CPUExecutionProvider"])
    return int(np.argmax(session.run(None, {session.get_inputs()[0].name: x})[0]))


def test_agent_answers_jpegs_with_the_label_of_the_reference_python_code(predict_agent, digits) -> None:
    from edgesdk.client import AgentClient

    with AgentClient(predict_agent.url) as client:
        for jpeg in _jpegs(digits, 12):
            answer = client.predict("digits", jpeg)
            assert isinstance(answer, dict)
            best = answer["labels"][0]
            assert best["label"] == LABELS[_reference_label(digits, jpeg)], answer
            assert len(answer["labels"]) == 3 and 0.0 < best["score"] <= 1.0


def test_corrupt_jpeg_and_bomb_are_4xx_and_the_agent_keeps_serving(predict_agent, digits) -> None:
    jpeg = _jpegs(digits, 1)[0]
    url = f"{predict_agent.url}/v1/models/digits/predict"
    with httpx.Client(timeout=30) as client:
        truncated = client.post(url, content=jpeg[: len(jpeg) // 2], headers={"Content-Type": "image/jpeg"})
        assert truncated.status_code == 400 and "decode" in truncated.json()["error"], truncated.text
        garbage = client.post(url, content=b"\xff\xd8\xff" + bytes(200), headers={"Content-Type": "image/jpeg"})
        assert garbage.status_code == 400 and "not a valid JPEG" in garbage.json()["error"]
        bomb = client.post(url, content=_png_declaring(2_000, 2_000), headers={"Content-Type": "image/png"})
        assert bomb.status_code == 413 and "4000000 pixels" in bomb.json()["error"], bomb.text
        gif = client.post(url, content=b"GIF89a", headers={"Content-Type": "image/gif"})
        assert gif.status_code == 415
        after = client.post(url, content=jpeg, headers={"Content-Type": "image/jpeg"})
        assert after.status_code == 200 and after.json()["labels"][0]["label"] in LABELS
    assert predict_agent.proc.poll() is None


def test_a_new_bundle_swaps_the_pipeline_with_the_model(digits_convert_dir, digits, tmp_path) -> None:
    """The pipeline rides in the bundle: installing release 2 with new labels serves them."""
    from edgesdk.client import AgentClient

    device = make_device(tmp_path / "device")
    _installed(device, _package_with_pipeline(device, digits_convert_dir, version="1.0.0", release=1, labels=LABELS))
    renamed = [f"digit-{i}" for i in range(10)]
    jpeg = _jpegs(digits, 1)[0]
    with AgentProcess(device) as running, AgentClient(running.url) as client:
        assert client.predict("digits", jpeg)["labels"][0]["label"] in LABELS
        _installed(
            device, _package_with_pipeline(device, digits_convert_dir, version="1.1.0", release=2, labels=renamed)
        )
        deadline = time.monotonic() + 60
        answer = client.predict("digits", jpeg)
        while answer["version"] != "1.1.0" and time.monotonic() < deadline:
            time.sleep(0.2)
            answer = client.predict("digits", jpeg)
        assert answer["version"] == "1.1.0", running.log()
        assert answer["labels"][0]["label"] == renamed[_reference_label(digits, jpeg)]


def _png_declaring(width: int, height: int) -> bytes:
    """A 100-byte PNG whose header declares ``width`` × ``height`` grey pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )
