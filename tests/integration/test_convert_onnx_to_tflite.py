"""An ``.onnx`` file reaches TFLite through onnx2tf (its own venv, a subprocess), validated in LiteRT.

Needs the onnx2tf toolchain (≈2.6 GB): skipped, visibly, where it is not installed (CI).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest
from edgesdk.converters import onnx2tf_route

from edgesdk.schemas.report import ConversionReport


@pytest.fixture(scope="module")
def onnx_to_tflite(digits, tmp_path_factory):
    if onnx2tf_route.find_onnx2tf() is None:
        pytest.skip(f"onnx2tf toolchain not installed: {onnx2tf_route.INSTALL_HINT}")
    before = hashlib.sha256(digits.onnx.read_bytes()).hexdigest()
    out = tmp_path_factory.mktemp("onnx2tf") / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", "convert", str(digits.onnx), "--profile", "rpi5-8gb",
         "--out", str(out), "--formats", "tflite", "--precisions", "fp32,int8",
         "--calibration", str(digits.calibration), "--validation", str(digits.validation), "--json"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out, before, digits


def test_digits_onnx_converts_to_tflite_fp32_and_int8_validated_in_litert(onnx_to_tflite) -> None:
    out, _, _ = onnx_to_tflite
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    shipped = {v.id: v for v in report.variants}
    assert set(shipped) == {"tflite-fp32", "tflite-int8"}, report.rejected
    for variant in shipped.values():
        assert variant.runtime.value == "litert" and variant.validation == "numeric"
        assert variant.accuracy is not None and variant.accuracy.passed, variant.accuracy
        # -k keeps NCHW: the signature matches the ONNX model's (batch fixed to 1).
        assert [(s.name, s.shape) for s in variant.inputs] == [("image", [1, 1, 8, 8])]
        assert [s.name for s in variant.outputs] == ["logits"]
    assert shipped["tflite-fp32"].accuracy.max_abs_diff["logits"] < 1e-3
    assert shipped["tflite-int8"].size < 0.5 * shipped["tflite-fp32"].size


def test_the_artifact_runs_in_litert_like_the_onnx_model(onnx_to_tflite) -> None:
    from edgesdk.runtimes import load_model

    out, _, digits = onnx_to_tflite
    image = np.load(digits.validation)["image"][:1]
    reference = load_model("onnxruntime", digits.onnx.read_bytes()).run({"image": image})["logits"]
    tflite = load_model("litert", (out / "artifacts" / "tflite-fp32" / "model.tflite").read_bytes())
    np.testing.assert_allclose(tflite.run({"image": image})["logits"], reference, atol=1e-4)


def test_the_users_onnx_file_is_left_untouched(onnx_to_tflite) -> None:
    _, before, digits = onnx_to_tflite
    assert hashlib.sha256(digits.onnx.read_bytes()).hexdigest() == before
