"""The sensitivity probe quantizes per channel: an opset-11 source (paddle2onnx's) is raised to the
opset the int8 builds use first, or the probe's DequantizeLinear(axis) is invalid (issue 38)."""

from __future__ import annotations

import numpy as np
import pytest


def _opset11_convnet(path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(size=(4, c, 3, 3)).astype(np.float32), f"w{i}") for i, c in enumerate((3, 4))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["h"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["r"], name="relu0"),
        helper.make_node("Conv", ["r", "w1"], ["y"], name="conv1", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        weights,
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(path))


def test_sensitivity_probe_ranks_the_layers_of_an_opset11_source(tmp_path) -> None:
    pytest.importorskip("onnxruntime.quantization")
    from edgesdk.converters.sensitivity import rank_layers
    from edgesdk.converters.source import load_source

    _opset11_convnet(tmp_path / "m.onnx")
    (tmp_path / "work").mkdir()
    source = load_source(tmp_path / "m.onnx", tmp_path / "work")
    calibration = {"x": np.random.default_rng(1).normal(size=(4, 3, 8, 8)).astype(np.float32)}
    ranked = rank_layers(source, calibration, tmp_path / "sensitivity", samples=4)
    assert {name for name, _ in ranked} == {"conv0", "conv1"}
    assert all(np.isfinite(score) for _, score in ranked)
