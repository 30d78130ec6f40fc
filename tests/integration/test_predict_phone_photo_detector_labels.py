"""``edgesdk package --pipeline --labels`` (the real CLI) checks a detector's labels against the
class columns of its boxes output, as it checks a classifier's against its classes: a list of
another length would answer wrong names by index at /predict. A tiny real ONNX detector (an
8 x 8 strided conv: 16 anchors, 4 box values [+ objectness] + 3 class scores a row) in a
convert dir whose report gives its output's shape."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from edgesdk.schemas.manifest import AccuracyResult, TensorSpec
from edgesdk.schemas.report import ConversionReport, ShippedVariant
from tests.agent_helpers import PROFILE, agent_env
from tests.bundle_helpers import make_keys

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

CLASSES = 3


def _detector(path: Path, columns: int, transposed: bool, x: np.ndarray) -> np.ndarray:
    """x (1, 3, 32, 32) → boxes (1, columns, 16), or (1, 16, columns) unless ``transposed``; its answer to ``x``."""
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((columns, 3, 8, 8)).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], strides=[8, 8]),
        helper.make_node("Reshape", ["c", "shape"], ["rows" if not transposed else "boxes"]),
    ]
    if not transposed:
        nodes.append(helper.make_node("Transpose", ["rows"], ["boxes"], perm=[0, 2, 1]))
    initializers = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array([1, columns, 16]), "shape")]
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, None)],
        initializers,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _convert_dir(out: Path, *, objectness: bool, transposed: bool) -> Path:
    """A convert dir holding the detector, its golden set and its report giving the shape the model answers."""
    model = out / "artifacts" / "onnx-fp32" / "model.onnx"
    model.parent.mkdir(parents=True)
    x = np.random.default_rng(1).random((1, 3, 32, 32), dtype=np.float32)
    answer = _detector(model, 4 + int(objectness) + CLASSES, transposed, x)
    np.savez(out / "golden.npz", x=x, **{"output:boxes": answer})
    variant = ShippedVariant(
        id="onnx-fp32",
        format="onnx",
        precision="fp32",
        runtime="onnxruntime",
        files=["artifacts/onnx-fp32/model.onnx"],
        size=model.stat().st_size,
        inputs=[TensorSpec(name="x", dtype="float32", shape=[1, 3, 32, 32])],
        outputs=[TensorSpec(name="boxes", dtype="float32", shape=list(answer.shape))],
        accuracy=AccuracyResult(metric="max_abs", value=0.0, gate=1e-4, passed=True, samples=1),
    )
    report = ConversionReport(
        model_name="detector",
        source=str(model),
        profile=PROFILE,
        created=datetime.now(timezone.utc),
        metric="max_abs",
        gate=1e-4,
        variants=[variant],
    )
    (out / "report.json").write_text(report.model_dump_json(indent=2))
    return out


def _package(
    tmp_path: Path, convert_dir: Path, boxes: str, labels: list[str]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    keys = make_keys(tmp_path / "keys")
    (tmp_path / "pipeline.yaml").write_text(
        f"input: image\nimage: {{scale: 0.0039}}\npost: {{kind: boxes, boxes: {boxes}}}\n"
    )
    (tmp_path / "labels.txt").write_text("".join(f"{label}\n" for label in labels))
    bundle = tmp_path / "detector.edgepkg"
    packaged = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "package", str(convert_dir), "--name", "detector"]
        + ["--version", "1.0.0", "--publisher-key", str(keys.publisher_key), "--recipient", str(keys.device_pub)]
        + ["--pipeline", str(tmp_path / "pipeline.yaml"), "--labels", str(tmp_path / "labels.txt")]
        + ["--out", str(bundle)],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=120,
    )
    return packaged, bundle


@pytest.mark.parametrize(
    ("objectness", "transposed", "labels", "refusal"),
    [
        (False, True, ["cat", "dog"], "2 labels for output 'boxes' of 3 classes (after the 4 box values of a row)"),
        (True, False, ["cat", "dog", "bird", "fish"], "4 labels for output 'boxes' of 3 classes (after the 5 box"),
    ],
    ids=["yolov8-transposed-too-few", "objectness-too-many"],
)
def test_a_detectors_labels_of_another_length_than_its_class_columns_are_refused_at_package_time(
    tmp_path: Path, objectness: bool, transposed: bool, labels: list[str], refusal: str
) -> None:
    convert_dir = _convert_dir(tmp_path / "out", objectness=objectness, transposed=transposed)
    boxes = f"{{objectness: {str(objectness).lower()}, transposed: {str(transposed).lower()}}}"
    packaged, bundle = _package(tmp_path, convert_dir, boxes, labels)
    assert packaged.returncode == 1 and packaged.stderr.count("\n") == 1, packaged.stderr
    assert refusal in packaged.stderr and "give one label a line, 3 lines" in packaged.stderr, packaged.stderr
    assert "Traceback" not in packaged.stderr and not bundle.exists()


def test_a_detectors_labels_naming_each_class_column_are_packaged(tmp_path: Path) -> None:
    convert_dir = _convert_dir(tmp_path / "out", objectness=False, transposed=True)
    packaged, bundle = _package(tmp_path, convert_dir, "{transposed: true}", ["cat", "dog", "bird"])
    assert packaged.returncode == 0, packaged.stderr
    assert bundle.exists() and "boxes" in packaged.stdout and "3 labels" in packaged.stdout, packaged.stdout
