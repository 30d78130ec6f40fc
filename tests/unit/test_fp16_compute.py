"""An OpenVINO fp16 IR is judged at f16 compute, not at whatever this host's CPU plugin picks (issue 38).

The stand-in keeps what made MediaPipe's pose_detection fail: a value far from zero (an
anchor offset) carried between layers, then scaled back down. bf16 (8 significant bits, what an
AVX512-BF16 host runs an fp16 IR in) loses pixels there; f16 (11 bits, what an fp16 device
computes) stays within the gate, and f32 (a host with neither) shows no error at all.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("openvino", reason="the fp16 IR check needs openvino (pip install 'edgesdk[convert]')")

WIDTH, OFFSET, SCALE, GATE = 16, 300.0, 4.0, 1.5


def _anchor_offset_ir(folder):
    """y = ((x @ I + OFFSET) @ (SCALE·I)) - SCALE·OFFSET, saved as an fp16 IR (f16 weights)."""
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([1, WIDTH], np.float32, name="x")
    eye = np.eye(WIDTH, dtype=np.float32)
    carried = ops.add(ops.matmul(x, ops.constant(eye), False, False), ops.constant(np.float32(OFFSET)))
    scaled = ops.matmul(carried, ops.constant(SCALE * eye), False, False)
    y = ops.subtract(scaled, ops.constant(np.float32(SCALE * OFFSET)))
    y.output(0).get_tensor().set_names({"y"})
    xml = folder / "model.xml"
    ov.save_model(ov.Model([y], [x], "anchor_offset"), str(xml), compress_to_fp16=True)
    return {"model.xml": xml, "model.bin": folder / "model.bin"}


def test_openvino_fp16_ir_is_judged_at_f16_compute(tmp_path) -> None:
    from edgesdk.converters.validate import validate_numeric

    from edgesdk.quality.output_metrics import OutputMetric

    x = np.random.default_rng(0).uniform(0, 1, (32, WIDTH)).astype(np.float32)
    reference = {"y": SCALE * x}
    result = validate_numeric(
        "openvino", _anchor_offset_ir(tmp_path), {"x": x}, reference, metric="max_abs", gate=GATE,
        options={"device": "CPU"}, metrics={"y": OutputMetric("abs", GATE)}, latency_runs=1,
    )  # fmt: skip
    (figure,) = result.output_accuracy
    # f16 rounds 300 + x to a quarter: up to 0.125 · 4, plus half of f16's 1 at ~1200.
    assert 0 < figure.value <= 1.0, f"not f16 arithmetic: worst |error| {figure.value} (bf16 ~4-8, f32 0)"
    assert figure.passed, figure.value
    assert "f16 compute" in result.measurements.note


def test_fp32_and_pinned_ir_are_not_rounded(tmp_path) -> None:
    """An IR whose precision the converters pinned (fp32, int8: ``f32``) is judged as loaded."""
    from edgesdk.converters.fp16_compute import is_fp16_ir

    files = {name: path.read_bytes() for name, path in _anchor_offset_ir(tmp_path).items()}
    assert is_fp16_ir("openvino", files, {"device": "CPU"})
    assert not is_fp16_ir("openvino", files, {"device": "CPU", "INFERENCE_PRECISION_HINT": "f32"})
    assert not is_fp16_ir("onnxruntime", files, None)
