"""An ``.onnx`` file reaches TFLite, validated in LiteRT, by either route: onnx2torch then
litert-torch (in the default install), or onnx2tf (its own venv, a subprocess, ≈2.6 GB: skipped,
visibly, where it is not installed, as on CI). MobileNetV2 goes through the light route too."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from edgesdk.converters import onnx2tf_route, onnx2torch_route

from edgesdk.schemas.report import ConversionReport


def _convert(digits, out: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "convert", str(digits.onnx), "--profile", "rpi5-8gb",
         "--out", str(out), "--formats", "tflite", "--precisions", "fp32,int8",
         "--calibration", str(digits.calibration), "--validation", str(digits.validation), "--json"],
        capture_output=True, text=True, timeout=900, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


ROUTES = {
    # onnx2tf's venv; the light route switched off so that this one is the one tested.
    "onnx2tf": ({onnx2torch_route.ENV_VAR: "0"}, "onnx2tf -ois"),
    # onnx2torch + litert-torch; onnx2tf pointed at nothing so that it cannot be the fallback.
    "onnx2torch": ({onnx2tf_route.ENV_VAR: "/nonexistent/onnx2tf"}, "onnx2torch + litert-torch"),
}


@pytest.fixture(scope="module", params=sorted(ROUTES))
def onnx_to_tflite(request, digits, tmp_path_factory):
    if request.param == "onnx2tf" and onnx2tf_route.find_onnx2tf() is None:
        pytest.skip(f"onnx2tf toolchain not installed: {onnx2tf_route.INSTALL_HINT}")
    if request.param == "onnx2torch" and onnx2torch_route.missing_reason():
        pytest.skip(onnx2torch_route.missing_reason())
    env, note = ROUTES[request.param]
    before = hashlib.sha256(digits.onnx.read_bytes()).hexdigest()
    out = tmp_path_factory.mktemp(request.param) / "out"
    _convert(digits, out, env)
    return out, before, digits, note


def test_digits_onnx_converts_to_tflite_fp32_and_int8_validated_in_litert(onnx_to_tflite) -> None:
    out, _, _, note = onnx_to_tflite
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    shipped = {v.id: v for v in report.variants}
    assert set(shipped) == {"tflite-fp32", "tflite-int8"}, report.rejected
    for variant in shipped.values():
        assert variant.runtime.value == "litert" and variant.validation == "numeric"
        assert variant.accuracy is not None and variant.accuracy.passed, variant.accuracy
        # -k keeps NCHW: the signature matches the ONNX model's (batch fixed to 1).
        assert [(s.name, s.shape) for s in variant.inputs] == [("image", [1, 1, 8, 8])]
        assert [s.name for s in variant.outputs] == ["logits"]
        assert f"static shapes (batch 1): {note}" in variant.measurements.note
    assert shipped["tflite-fp32"].accuracy.max_abs_diff["logits"] < 1e-3
    assert shipped["tflite-int8"].size < 0.5 * shipped["tflite-fp32"].size


def test_the_artifact_runs_in_litert_like_the_onnx_model(onnx_to_tflite) -> None:
    from edgesdk.runtimes import load_model

    out, _, digits, _ = onnx_to_tflite
    image = np.load(digits.validation)["image"][:1]
    reference = load_model("onnxruntime", digits.onnx.read_bytes()).run({"image": image})["logits"]
    tflite = load_model("litert", (out / "artifacts" / "tflite-fp32" / "model.tflite").read_bytes())
    np.testing.assert_allclose(tflite.run({"image": image})["logits"], reference, atol=1e-4)


def test_the_users_onnx_file_is_left_untouched(onnx_to_tflite) -> None:
    _, before, digits, _ = onnx_to_tflite
    assert hashlib.sha256(digits.onnx.read_bytes()).hexdigest() == before


def test_mobilenet_v2_onnx_reaches_litert_through_onnx2torch(tmp_path: Path) -> None:
    """The light route's coverage beyond the digits CNN: MobileNetV2 (depthwise convs, ReLU6,
    the classifier's Flatten/Gemm) converts and answers like onnxruntime."""
    if onnx2torch_route.missing_reason():
        pytest.skip(onnx2torch_route.missing_reason())
    torch = pytest.importorskip("torch")
    litert_torch = pytest.importorskip("litert_torch")
    from edgesdk.runtimes import load_model
    from edgesdk.workloads.mobilenet import pretrained_mobilenet_v2

    path = tmp_path / "mobilenet_v2.onnx"
    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    torch.onnx.export(
        pretrained_mobilenet_v2(), (torch.from_numpy(image),), str(path), input_names=["image"],
        output_names=["logits"], opset_version=17, dynamo=False,
    )  # fmt: skip
    module = onnx2torch_route.onnx_to_torch(path, where=path.name)
    converted = litert_torch.convert(module, (torch.from_numpy(image),)).model_content()
    reference = load_model("onnxruntime", path.read_bytes()).run({"image": image})["logits"]
    got = load_model("litert", bytes(converted)).run({"args_0": image})
    np.testing.assert_allclose(next(iter(got.values())), reference, atol=1e-3)
    assert int(np.argmax(next(iter(got.values())))) == int(np.argmax(reference))
