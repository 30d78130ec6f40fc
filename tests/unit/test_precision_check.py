"""No fake int8: a variant called int8 holds integer or Q/DQ ops and is smaller than fp32."""

from __future__ import annotations

import numpy as np
import pytest
from edgesdk.converters.precision_check import check_int8

from edgesdk.errors import ConversionError
from edgesdk.schemas.common import ModelFormat

onnx = pytest.importorskip("onnx", reason="the ONNX checks read ONNX files (edgesdk[convert])")


def _model(path, quantized: bool):
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")]
    inits = [weight]
    if quantized:
        inits += [
            numpy_helper.from_array(np.array(0.1, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.int8), "z"),
        ]
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
            helper.make_node("MatMul", ["xd", "W"], ["y"], name="fc"),
        ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        inits,
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_float_file_called_int8_is_refused(tmp_path) -> None:
    path = _model(tmp_path / "model.onnx", quantized=False)
    with pytest.raises(ConversionError, match="not int8: the file has no integer or Q/DQ operators"):
        check_int8(ModelFormat.ONNX, {"model.onnx": path}, 10**6, None)


def test_q_dq_ops_that_save_nothing_are_refused_and_a_smaller_file_passes(tmp_path) -> None:
    path = _model(tmp_path / "model.onnx", quantized=True)
    size = path.stat().st_size
    with pytest.raises(ConversionError, match=rf"not int8: {size} bytes, not smaller than fp32's {size}"):
        check_int8(ModelFormat.ONNX, {"model.onnx": path}, size, None)
    assert check_int8(ModelFormat.ONNX, {"model.onnx": path}, size + 1, None) == []


def test_a_prebuilt_files_precision_is_read_from_its_ops(tmp_path) -> None:
    from edgesdk.converters.prebuilt import native_precision

    from edgesdk.schemas.common import Precision

    assert native_precision(ModelFormat.ONNX, {"model.onnx": _model(tmp_path / "f.onnx", quantized=False)}) == (
        Precision.FP32
    )
    assert native_precision(ModelFormat.ONNX, {"model.onnx": _model(tmp_path / "q.onnx", quantized=True)}) == (
        Precision.INT8
    )
    layer = '<layer id="{i}" type="{t}"><data element_type="{e}"/></layer>'
    for consts, want in ((["f32"], Precision.FP32), (["f32", "f16"], Precision.FP16), (["f16", "i8"], Precision.INT8)):
        layers = "".join(layer.format(i=i, t="Const", e=e) for i, e in enumerate(consts))
        xml = tmp_path / f"{want.value}.xml"
        xml.write_text(f'<net name="m" version="11"><layers>{layers}</layers></net>')
        assert native_precision(ModelFormat.OPENVINO, {"model.xml": xml}) == want
