"""A conversion failure is told apart by its type, taken from the library's own exception type
or from what the pipeline knows, never from the words of a message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from edgesdk.converters.pipeline import convert
from edgesdk.converters.source import export_torch

from edgesdk.errors import BudgetError, ConversionError, ModelError, UnsupportedOpError


def _custom_op_onnx(path: Path) -> Path:
    """One node of an op no converter knows: ``com.example.FooBar``."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    node = helper.make_node("FooBar", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, str(path))
    return path


def test_an_op_onnx_cannot_express_is_unsupported_op(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Spectrum(torch.nn.Module):
        def forward(self, x):  # aten::fft_fft has no ONNX export at opset 17
            return torch.fft.fft(x).real

    with pytest.raises(UnsupportedOpError, match="fft"):
        export_torch(Spectrum(), {"x": np.zeros((1, 8), np.float32)}, None, None, tmp_path, "spectrum")


def test_a_model_that_fails_while_tracing_is_a_model_error(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Broken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls > 1:  # the first call (naming the outputs) works, the export's does not
                raise RuntimeError("not supported by this model's author")
            return x

    with pytest.raises(ModelError) as caught:
        export_torch(Broken(), {"x": np.zeros((1, 3), np.float32)}, None, None, tmp_path, "broken")
    # The words "not supported" in a user's error do not make it an op the format lacks.
    assert not isinstance(caught.value, UnsupportedOpError)


def test_openvino_without_a_conversion_rule_is_unsupported_op(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    from edgesdk.converters.base import SourceModel
    from edgesdk.converters.openvino_backend import _read

    path = _custom_op_onnx(tmp_path / "custom.onnx")
    source = SourceModel(
        name="custom", source=str(path), onnx_path=path, inputs=[], outputs=[], example={}, torch_module=None
    )
    with pytest.raises(UnsupportedOpError, match="FooBar"):
        _read(source)


def test_openvino_on_a_file_that_is_no_model_is_a_conversion_error(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    from edgesdk.converters.base import SourceModel
    from edgesdk.converters.openvino_backend import _read

    path = tmp_path / "junk.onnx"
    path.write_bytes(b"not supported, not a model")
    source = SourceModel(
        name="junk", source=str(path), onnx_path=path, inputs=[], outputs=[], example={}, torch_module=None
    )
    with pytest.raises(ConversionError) as caught:
        _read(source)
    assert not isinstance(caught.value, UnsupportedOpError)


def test_nothing_within_the_budget_is_a_budget_error(digits, tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "tiny-pi.yaml").write_text(
        "schema_version: 1\nname: tiny-pi\ndisplay_name: Raspberry Pi 5 with a tiny model budget\nvendor: test\n"
        "extends: rpi5-8gb\nstorage:\n  storage_gb: 1\n  max_artifact_mb: 0.01\n"
    )
    with pytest.raises(BudgetError, match="artifact budget 0.01 MB"):
        convert(
            digits.onnx,
            "tiny-pi",
            tmp_path / "out",
            calibration=digits.calibration,
            formats=["onnx"],
            profiles_dirs=[str(profiles)],
        )
