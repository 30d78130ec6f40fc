"""The uint8-activation static QDQ recipes (U8S8): activations uint8, weights int8 per channel."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.base import ConversionRequest
from edgesdk.converters.onnx_backend import OnnxConverter

from edgesdk.schemas.common import Precision
from tests.onnx_builders import convnet_source, tiny_convnet

onnx = pytest.importorskip("onnx", reason="ONNX int8 recipes need onnx (pip install 'edgesdk[convert]')")
pytest.importorskip("onnxruntime.quantization")
from onnx import TensorProto  # noqa: E402


def _conv_net(tmp_path):
    rng = np.random.default_rng(1)
    path = tiny_convnet(tmp_path / "convnet.onnx")
    source = convnet_source(path, rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
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
