"""The uint8-activation static QDQ recipes (U8S8): activations uint8, weights int8 per channel."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.base import ConversionRequest, SourceModel
from edgesdk.converters.onnx_backend import OnnxConverter

from edgesdk.schemas.common import Precision
from edgesdk.schemas.manifest import TensorSpec

onnx = pytest.importorskip("onnx", reason="ONNX int8 recipes need onnx (pip install 'edgesdk[convert]')")
pytest.importorskip("onnxruntime.quantization")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _conv_net(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r1"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["flat"], name="flat"),
        helper.make_node("Gemm", ["flat", "fc"], ["logits"], name="fc", transB=1),
    ]
    inits = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "b1": rng.standard_normal(8).astype(np.float32),
        "fc": rng.standard_normal((10, 8)).astype(np.float32),
    }
    graph = helper.make_graph(
        nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )  # fmt: skip
    path = tmp_path / "convnet.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    source = SourceModel(
        "convnet", str(path), path, [TensorSpec(name="x", dtype="float32", shape=["batch", 3, 8, 8])],
        [TensorSpec(name="logits", dtype="float32", shape=["batch", 10])], {"x": x},
    )  # fmt: skip
    return source, {"x": rng.standard_normal((16, 3, 8, 8)).astype(np.float32)}


def _zero_point_types(path) -> dict[str, set[int]]:
    """Activation vs weight QuantizeLinear/DequantizeLinear zero-point element types."""
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    types: dict[str, set[int]] = {"activation": set(), "weight": set()}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and len(node.input) > 2 and node.input[2] in inits:
            stored = inits.get(node.input[0])
            if stored is not None and len(stored.dims) <= 1:
                continue  # a quantized bias (int32)
            types["weight" if stored is not None else "activation"].add(inits[node.input[2]].data_type)
    return types


@pytest.mark.parametrize(
    ("method", "activation"),
    [
        ("static-qdq-per-channel", TensorProto.INT8),
        ("static-qdq-u8", TensorProto.UINT8),
        ("static-qdq-percentile-u8", TensorProto.UINT8),
    ],
)
def test_static_recipes_choose_the_activation_type(tmp_path, method, activation) -> None:
    source, calibration = _conv_net(tmp_path)
    artifact = OnnxConverter().convert(
        ConversionRequest(source, Precision.INT8, tmp_path / method, method=method, calibration=calibration)
    )
    assert artifact.method == method
    types = _zero_point_types(artifact.files["model.onnx"])
    assert types["activation"] == {activation}
    assert types["weight"] == {TensorProto.INT8}  # weights stay signed, per channel


def test_the_u8_recipe_keeps_its_layers_in_float_when_asked(tmp_path) -> None:
    source, calibration = _conv_net(tmp_path)
    artifact = OnnxConverter().convert(
        ConversionRequest(
            source,
            Precision.INT8,
            tmp_path / "keep",
            method="static-qdq-u8",
            calibration=calibration,
            keep_float=["conv1"],
        )  # fmt: skip
    )
    model = onnx.load(str(artifact.files["model.onnx"]))
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert producers.get(conv.input[1]) != "DequantizeLinear"  # float weights
    assert artifact.notes == ["kept in float: conv1"]
