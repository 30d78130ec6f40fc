"""Constant-node weights become initializers (converters/constant_weights.py), and every dynamic
marker of an ONNX dimension reads as dynamic (source._dim): issue 38, defects 3 and 5."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs edgesdk[convert]")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))


def _paddle_like() -> onnx.ModelProto:
    """y = If(flag, then: x @ W + b, else: x @ W): every weight a Constant node, one inside a
    branch; plus a ``value_float`` Constant, which stays a node."""
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    then = helper.make_graph(
        [_constant("b", b), helper.make_node("Add", ["xw", "b"], ["t"])],
        "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [None, 3])],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Identity", ["xw"], ["e"])], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [None, 3])]
    )  # fmt: skip
    nodes = [
        _constant("W", w),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("MatMul", ["x", "W"], ["xw0"]),
        helper.make_node("Mul", ["xw0", "half"], ["xw"]),
        helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes, "paddle_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4]), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_constant_weights_move_into_initializers_in_the_graph_and_its_branches_outputs_unchanged() -> None:
    ort = pytest.importorskip("onnxruntime")
    from edgesdk.converters.constant_weights import fold_constant_weights

    model = _paddle_like()
    feeds = {"x": np.ones((2, 4), np.float32), "flag": np.array(True)}
    before = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    assert fold_constant_weights(model) == 2
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.initializer] == ["W"]
    then = next(a.g for a in model.graph.node[-1].attribute if a.name == "then_branch")
    assert [i.name for i in then.initializer] == ["b"] and [n.op_type for n in then.node] == ["Add"]
    assert [n.op_type for n in model.graph.node] == ["Constant", "MatMul", "Mul", "If"]  # value_float stays
    after = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(before, after)


def test_every_dynamic_marker_of_an_onnx_dimension_reads_as_dynamic() -> None:
    from edgesdk.converters.source import _value_info_spec

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "batch", None, 0])
    value.type.tensor_type.shape.dim[3].dim_param = ""  # set but empty, as Silero VAD's export has it
    assert _value_info_spec(value).shape == [None, 3, "batch", None, None]
