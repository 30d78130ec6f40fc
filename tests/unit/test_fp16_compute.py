"""fp16 variants that compute what fp16 computes (issue 38): an OpenVINO fp16 IR is judged at f16
compute, not at whatever this host's CPU plugin picks; an ONNX fp16 keeps in float32 the layers
whose weights float16 cannot hold, rather than clamping them.

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


def test_onnx_fp16_keeps_a_layer_whose_weights_exceed_float16_in_float32(tmp_path) -> None:
    """PP-OCRv4's detector keeps a BatchNormalization with a running variance of ~1e8: clamped to
    float16's 65504, its output came out ~40x too large. That node stays float32; the rest is fp16."""
    pytest.importorskip("onnxconverter_common", reason="onnx fp16 needs onnxconverter-common (edgesdk[convert])")
    import onnx
    import onnxruntime as ort
    from edgesdk.converters.base import ConversionRequest
    from edgesdk.converters.onnx_backend import OnnxConverter
    from edgesdk.converters.source import load_source
    from onnx import TensorProto, helper, numpy_helper

    from edgesdk.schemas.common import Precision

    channels = 4
    weights = {"scale": np.ones(channels), "bias": np.zeros(channels), "mean": np.zeros(channels),
               "var": np.full(channels, 1e8), "w": np.eye(channels).reshape(channels, channels, 1, 1)}  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], name="bn")],
        "wide_variance",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 4, 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    path = tmp_path / "wide_variance.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    (tmp_path / "work").mkdir()
    source = load_source(str(path), tmp_path / "work")
    artifact = OnnxConverter().convert(ConversionRequest(source, Precision.FP16, tmp_path / "fp16"))
    x = np.random.default_rng(0).uniform(-2e4, 2e4, (1, channels, 4, 4)).astype(np.float32)
    (got,) = ort.InferenceSession(str(artifact.files["model.onnx"])).run(None, {"x": x})
    np.testing.assert_allclose(got, x / 1e4, atol=0.05)  # clamped: x / 256
    assert any("bn" in note for note in artifact.notes), artifact.notes
    kinds = {i.name: i.data_type for i in onnx.load(str(artifact.files["model.onnx"])).graph.initializer}
    assert kinds["w"] == TensorProto.FLOAT16 and kinds["var"] == TensorProto.FLOAT, kinds  # the conv is fp16
