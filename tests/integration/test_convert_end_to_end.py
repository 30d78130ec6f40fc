"""``edgesdk convert --pipeline --validation-images --reference``: every variant of the digits CNN
answers real PNG files through the bundle's pipeline (decode → pre → model → post, in its
runtime on this host) and is gated on the labels of the user's own function (Pillow + numpy +
onnxruntime, written the usual way); a pipeline that normalizes differently from that function
ships nothing, with the figure; the validated bundle's agent answers a JPEG with the label the
user's function gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.agent_helpers import PROFILE, AgentProcess, agent_env, make_device, run_agent_cli

Image = pytest.importorskip("PIL.Image", reason="the pipeline's decoder needs Pillow (pip install 'edgesdk[pipeline]')")
pytest.importorskip("onnxruntime")

FILES = 40
LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
PIPELINE = """\
input: image
image:
  color: L
  resize: {height: 8, width: 8, interpolation: bilinear}
  scale: 0.00392156862745098
post:
  activation: softmax
  top_k: 3
"""
#: The same pipeline with ImageNet-style mean/std the user's function does not apply.
MISNORMALIZED = PIPELINE.replace(
    "  scale: 0.00392156862745098\n", "  scale: 0.00392156862745098\n  mean: [0.5]\n  std: [0.5]\n"
)
USER_FUNCTION = '''\
"""My current pipeline, written the usual way."""
import os

import numpy as np
import onnxruntime as ort
from PIL import Image

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SESSION = ort.InferenceSession(os.environ["DIGITS_ONNX"], providers=["CPUExecutionProvider"])


def predict(path):
    image = Image.open(path).convert("L").resize((8, 8), Image.Resampling.BILINEAR)
    x = (np.asarray(image, dtype=np.float32) / 255.0)[None, None]
    logits = SESSION.run(None, {"image": x})[0][0]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return LABELS[int(p.argmax())], float(p.max())
'''


def _write_inputs(digits, root: Path) -> Path:
    """The user's side: PNG files of test digits drawn 4x larger, their function, pipeline, labels."""
    images = root / "images"
    images.mkdir(parents=True)
    for i, pixels in enumerate(np.load(digits.validation)["image"][:FILES, 0]):
        picture = Image.fromarray(np.rint(pixels * 255).astype(np.uint8)).resize((32, 32), Image.Resampling.NEAREST)
        picture.save(images / f"digit-{i:03d}.png")
    (root / "my_preprocess.py").write_text(USER_FUNCTION)
    (root / "pipeline.yaml").write_text(PIPELINE)
    (root / "misnormalized.yaml").write_text(MISNORMALIZED)
    (root / "labels.txt").write_text("\n".join(LABELS) + "\n")
    return root


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "edgesdk.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def _convert(digits, root: Path, pipeline: str, out: str, precisions: str) -> subprocess.CompletedProcess[str]:
    env = {**agent_env(), "DIGITS_ONNX": str(digits.onnx)}
    return _cli(
        "convert", str(digits.onnx), "--profile", PROFILE, "--formats", "onnx", "--precisions", precisions,
        "--out", str(root / out), "--calibration", str(digits.calibration), "--validation", str(digits.validation),
        "--pipeline", str(root / pipeline), "--labels", str(root / "labels.txt"),
        "--validation-images", str(root / "images"), "--reference", f"{root / 'my_preprocess.py'}:predict",
        env=env, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def user_side(digits, tmp_path_factory) -> Path:
    return _write_inputs(digits, tmp_path_factory.mktemp("end-to-end"))


@pytest.fixture(scope="module")
def validated(user_side: Path, digits):
    proc = _convert(digits, user_side, "pipeline.yaml", "out", "fp32,int8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_every_variant_is_gated_end_to_end_on_the_users_own_labels(validated, user_side: Path) -> None:
    from edgesdk.converters.end_to_end import pipeline_sha256

    from edgesdk.schemas.pipeline import load_pipeline
    from edgesdk.schemas.report import ConversionReport

    report = ConversionReport.model_validate_json((user_side / "out" / "report.json").read_text())
    assert report.end_to_end is not None and report.end_to_end.files == FILES
    wanted = pipeline_sha256(load_pipeline(user_side / "pipeline.yaml", user_side / "labels.txt"))
    assert report.end_to_end.pipeline_sha256 == wanted
    assert {v.id for v in report.variants} == {"onnx-fp32", "onnx-int8"}
    for variant in report.variants:
        task = variant.task_accuracy
        assert task is not None and task.samples == FILES and task.passed, variant.id
        assert task.agreement >= 0.95 and task.score_diff is not None and task.score_diff <= 0.05
        assert variant.accuracy is not None and variant.accuracy.passed  # the tensor gate, beside it
        # Both figures on the printed report: the tensor gate's line and the end-to-end line.
        assert f"{variant.id} logits: top1" in validated.stdout
        assert f"{variant.id} end to end: task top-1 label agreement" in validated.stdout
    assert "end to end: your labels (95% lower bound)" in validated.stdout  # the table's column
    fp32 = next(v for v in report.variants if v.id == "onnx-fp32").task_accuracy
    assert fp32 is not None and fp32.agreement == 1.0 and fp32.score_diff is not None and fp32.score_diff < 1e-4


def test_a_misnormalized_pipeline_ships_nothing_and_says_its_agreement(digits, user_side: Path) -> None:
    proc = _convert(digits, user_side, "misnormalized.yaml", "bad", "fp32")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "fp32 dropped end to end: task top-1 label agreement" in line, line
    agreement = float(line.split("label agreement ")[1].split("%")[0])
    assert agreement < 90, line  # far below the 99% gate: the mean/std really changes the answers
    assert "(yours " in line and not (user_side / "bad").exists()


def test_package_signs_only_the_pipeline_that_was_validated(validated, edgesdk_cli, user_side: Path, tmp_path) -> None:
    device = make_device(tmp_path / "device")
    proc = edgesdk_cli(
        "package", str(user_side / "out"), "--name", "digits", "--version", "1.0.0", "--release", "1",
        "--publisher-key", str(device.publisher_key), "--recipient", str(device.device_pub),
        "--out", str(tmp_path / "other.edgepkg"),
        "--pipeline", str(user_side / "misnormalized.yaml"), "--labels", str(user_side / "labels.txt"),
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "is not the pipeline" in proc.stderr and "validated with end to end" in proc.stderr, proc.stderr


def test_the_validated_bundle_answers_a_jpeg_with_the_users_label(
    validated, edgesdk_cli, user_side: Path, digits, tmp_path, monkeypatch
) -> None:
    from edgesdk.converters.end_to_end import load_reference

    from edgesdk.client import AgentClient

    device = make_device(tmp_path / "device")
    bundle = tmp_path / "digits.edgepkg"
    packaged = edgesdk_cli(
        "package", str(user_side / "out"), "--name", "digits", "--version", "1.0.0", "--release", "1",
        "--publisher-key", str(device.publisher_key), "--recipient", str(device.device_pub), "--target", PROFILE,
        "--out", str(bundle), "--pipeline", str(user_side / "pipeline.yaml"), "--labels", str(user_side / "labels.txt"),
    )  # fmt: skip
    assert packaged.returncode == 0, packaged.stderr
    installed = run_agent_cli("install", "--config", str(device.config), str(bundle))
    assert installed.returncode == 0, installed.stderr
    jpegs = []
    for name in ("digit-003.png", "digit-017.png", "digit-029.png"):
        jpeg = tmp_path / name.replace(".png", ".jpg")
        Image.open(user_side / "images" / name).save(jpeg, format="JPEG", quality=90)
        jpegs.append(jpeg)
    monkeypatch.setenv("DIGITS_ONNX", str(digits.onnx))
    predict = load_reference(f"{user_side / 'my_preprocess.py'}:predict")  # the user's own function
    with AgentProcess(device) as agent, AgentClient(agent.url) as client:
        for jpeg in jpegs:
            answer = client.predict("digits", jpeg.read_bytes())
            label, score = predict(jpeg)
            assert answer["labels"][0]["label"] == label, (jpeg.name, answer, label)
            assert abs(answer["labels"][0]["score"] - score) < 1e-3
    assert json.loads((user_side / "out" / "report.json").read_text())["end_to_end"]["files"] == FILES
