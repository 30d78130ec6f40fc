"""Model families from the ONNX graph, and the recipes each converter builds for them."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.recipes import RECIPES, Family, classify, detect_family, read_traits

onnx = pytest.importorskip("onnx", reason="family detection reads ONNX graphs (pip install 'edgesdk[convert]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _save(tmp_path, nodes, inputs, outputs, initializers, name):
    graph = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(a, n) for n, a in initializers])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _attention_block(tmp_path):
    f = TensorProto.FLOAT
    w = {k: np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32) for k in ("wq", "wk", "wv", "wo")}
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["x"], name="embed"),
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln", axis=-1),
        *[helper.make_node("MatMul", ["h", k], [k + "_out"], name=k) for k in ("wq", "wk", "wv")],
        helper.make_node("Transpose", ["wk_out"], ["kt"], perm=[0, 2, 1], name="kt"),
        helper.make_node("MatMul", ["wq_out", "kt"], ["scores"], name="scores"),
        helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "wv_out"], ["ctx"], name="context"),
        helper.make_node("MatMul", ["ctx", "wo"], ["y"], name="wo"),
    ]
    inits = [("table", np.zeros((50, 8), np.float32)), ("gamma", np.ones(8, np.float32)),
             ("beta", np.zeros(8, np.float32)), *w.items()]  # fmt: skip
    return _save(
        tmp_path, nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("y", f, [1, 4, 8])], inits, "attention",
    )  # fmt: skip


def _conv_net(tmp_path):
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r1"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["flat"], name="flat"),
        helper.make_node("Gemm", ["flat", "fc"], ["logits"], name="fc", transB=1),
    ]
    inits = [("w1", np.zeros((4, 1, 3, 3), np.float32)), ("fc", np.zeros((10, 4), np.float32))]
    return _save(
        tmp_path, nodes, [helper.make_tensor_value_info("x", f, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", f, [1, 10])], inits, "convnet",
    )  # fmt: skip


def test_an_attention_graph_is_a_transformer(tmp_path) -> None:
    traits = read_traits(_attention_block(tmp_path))
    assert (traits.weight_matmuls, traits.activation_matmuls, traits.softmaxes) == (4, 2, 1)
    assert (traits.layer_norms, traits.embedding_gathers, traits.convs) == (1, 1, 0)
    family, why = classify(traits)
    assert family == Family.TRANSFORMER and "attention" in why


def test_a_conv_graph_is_a_convnet(tmp_path) -> None:
    family, why = detect_family(_conv_net(tmp_path))
    assert family == Family.CONVNET and "1 Conv" in why


def test_every_recipe_has_a_builder_in_its_backend() -> None:
    from edgesdk.converters import onnx_backend, openvino_backend

    built = {
        "onnx": set(onnx_backend._INT8_BUILDERS),
        "openvino": {*openvino_backend._PTQ_OPTIONS, openvino_backend.ACCURACY_CONTROL, "nncf-weights-int8"},
    }
    for converter, methods in built.items():
        wanted = {m for family in RECIPES[converter].values() for m in family}
        assert wanted <= methods, f"{converter}: no builder for {wanted - methods}"
