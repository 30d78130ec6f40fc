"""The onnx2torch route on small ONNX graphs built here: the fixes it registers (Flatten at
axis 0, GreaterOrEqual at opset 17, a Clip with an empty max) give onnxruntime's answers, an op
it cannot map is a one-line UnsupportedOpError naming it, and torchvision's stand-in is gone
after the import (transformers looks for torchvision)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from edgesdk.converters import onnx2torch_route

from edgesdk.errors import UnsupportedOpError

if onnx2torch_route.missing_reason():  # importorskip would import it, and it imports torchvision
    pytest.skip(onnx2torch_route.missing_reason(), allow_module_level=True)
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
from onnx import TensorProto, helper  # noqa: E402


def _save(tmp_path: Path, nodes: list, inputs: list, outputs: list, initializers: list | None = None) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return path


def _reference(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_the_registered_fixes_answer_like_onnxruntime(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    low = helper.make_tensor("low", TensorProto.FLOAT, [], [0.25])
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    nodes = [
        helper.make_node("Flatten", ["x"], ["flat0"], axis=0),  # [1, 24]: onnx2torch's own gets it wrong
        helper.make_node("Flatten", ["x"], ["flat2"], axis=2),  # [6, 4]
        helper.make_node("Clip", ["x", "low", ""], ["clipped"]),  # max left out by an empty name
        helper.make_node("GreaterOrEqual", ["x", "half"], ["ge"]),  # version 16 at opset 17
    ]
    outputs = [
        helper.make_tensor_value_info("flat0", TensorProto.FLOAT, [1, 24]),
        helper.make_tensor_value_info("flat2", TensorProto.FLOAT, [6, 4]),
        helper.make_tensor_value_info("clipped", TensorProto.FLOAT, [2, 3, 4]),
        helper.make_tensor_value_info("ge", TensorProto.BOOL, [2, 3, 4]),
    ]
    path = _save(tmp_path, nodes, [x], outputs, [low, half])
    feeds = {"x": np.random.default_rng(0).random((2, 3, 4), dtype=np.float32)}
    module = onnx2torch_route.onnx_to_torch(path, where="model.onnx")
    with torch.no_grad():
        got = module(torch.from_numpy(feeds["x"]))
    for ours, theirs in zip(got, _reference(path, feeds), strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_array_equal(ours.numpy(), theirs)


def test_an_op_it_cannot_map_is_an_unsupported_op_naming_it(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
    path = _save(tmp_path, [helper.make_node("Hardmax", ["x"], ["y"])], [x], [y])
    with pytest.raises(UnsupportedOpError, match="Hardmax") as caught:
        onnx2torch_route.onnx_to_torch(path, where="model.onnx")
    assert "\n" not in str(caught.value)


def test_the_torchvision_stand_in_does_not_outlive_the_import() -> None:
    onnx2torch_route._onnx2torch()
    stand_in = sys.modules.get("torchvision")
    assert stand_in is None or getattr(stand_in, "__file__", None) is not None  # a real one, if any
    if stand_in is None:
        try:
            importlib.util.find_spec("torchvision")  # what transformers asks; must not trip on a stand-in
        except ValueError as exc:  # "torchvision.__spec__ is None": a module object without a spec
            pytest.fail(f"a torchvision stand-in is left in sys.modules: {exc}")


def test_the_route_can_be_switched_off(monkeypatch) -> None:
    monkeypatch.setenv(onnx2torch_route.ENV_VAR, "0")
    assert "switched off" in (onnx2torch_route.missing_reason() or "")
