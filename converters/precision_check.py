"""A variant is what its name says: an "int8" file holds integer or Q/DQ operators and is
smaller than fp32; an "fp16" file holds float16 tensors; an fp16 ONNX file has consistent
types in every sub-graph.

A quantizer that finds nothing to quantize (a model whose layers sit inside ``If``/``Loop``
branches, which onnxruntime's static QDQ does not enter) writes a float file a little
*larger* than fp32 and bit-identical to it; shipped as "int8" it would be a governor step that
saves nothing. Each check raises :class:`ConversionError` with the reason, and the pipeline
rejects that method (another may still hold: dynamic int8 does quantize inside branches).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from edgesdk.errors import ConversionError
from edgesdk.schemas.common import ModelFormat

#: ONNX ops that only an integer (or Q/DQ) model has.
ONNX_INTEGER_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "MatMulNBits",
        "QGemm",
        "QAttention",
    }
)
#: The ops whose weights int8 is about (the same list repair uses).
ONNX_WEIGHT_OPS = frozenset({"Conv", "Gemm", "MatMul", "ConvTranspose"})
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
_OPENVINO_INTEGER_TYPES = frozenset({"i8", "u8", "i4", "u4"})


def onnx_nodes(graph: Any, inside: str = "") -> Iterator[tuple[Any, str]]:
    """Every node of ``graph`` and of its sub-graphs (If/Loop/Scan bodies), with the control-flow
    node it sits in ("" at the top level)."""
    import onnx

    for node in graph.node:
        yield node, inside
        for attribute in node.attribute:
            label = f"{node.op_type} {node.name or '?'}"
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from onnx_nodes(attribute.g, label)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for sub in attribute.graphs:
                    yield from onnx_nodes(sub, label)


def layers_in_control_flow(onnx_path: Path) -> tuple[int, int, list[str]]:
    """(weight layers in all, of them inside sub-graphs, the control-flow nodes holding them)."""
    import onnx

    model = onnx.load(str(onnx_path))
    total = inside = 0
    holders: list[str] = []
    for node, where in onnx_nodes(model.graph):
        if node.op_type in ONNX_WEIGHT_OPS:
            total += 1
            if where:
                inside += 1
                if where not in holders:
                    holders.append(where)
    return total, inside, holders


def _onnx_integer_ops(path: Path) -> tuple[int, int]:
    """(integer/QDQ ops in the top graph, in sub-graphs)."""
    import onnx

    top = nested = 0
    for node, where in onnx_nodes(onnx.load(str(path)).graph):
        if node.op_type in ONNX_INTEGER_OPS or node.op_type.startswith("QLinear"):
            if where:
                nested += 1
            else:
                top += 1
    return top, nested


def _openvino_integer_ops(xml_path: Path) -> int:
    """FakeQuantize layers and integer constants anywhere in the IR (bodies of If/Loop nest in the XML)."""
    count = 0
    for layer in ET.parse(xml_path).getroot().iter("layer"):
        kind = layer.get("type", "")
        data = layer.find("data")
        element = data.get("element_type", "") if data is not None else ""
        if kind == "FakeQuantize" or (kind == "Const" and element in _OPENVINO_INTEGER_TYPES):
            count += 1
    return count


def _tflite_integer_tensors(path: Path) -> int | None:
    """Integer-typed float-model tensors (int8/int16 weights or activations); None without LiteRT."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return None
    import numpy as np

    interpreter = Interpreter(model_content=path.read_bytes())
    return sum(
        1
        for t in interpreter.get_tensor_details()
        if np.dtype(t["dtype"]) in (np.int8, np.uint8, np.int16) and t["quantization_parameters"]["scales"].size
    )


def check_int8(fmt: ModelFormat, files: Mapping[str, Path], fp32_size: int, source_onnx: Path | None) -> list[str]:
    """Raise ConversionError unless the int8 variant really is one; return notes for the report."""
    size = sum(p.stat().st_size for p in files.values())
    notes: list[str] = []
    integer: int | None
    if fmt == ModelFormat.ONNX:
        top, nested = _onnx_integer_ops(files["model.onnx"])
        integer = top + nested
        if source_onnx is not None and integer:
            total, inside, holders = layers_in_control_flow(source_onnx)
            if inside and not nested:
                notes.append(
                    f"{inside} of {total} weight layers sit inside {', '.join(holders)} and stay float "
                    "(this quantizer does not enter sub-graphs)"
                )
    elif fmt == ModelFormat.OPENVINO:
        integer = _openvino_integer_ops(files["model.xml"])
    elif fmt == ModelFormat.TFLITE:
        integer = _tflite_integer_tensors(files["model.tflite"])
    else:
        integer = None  # Core ML palettized/linear weights: the size check below still holds
    if integer == 0:
        why = ""
        if fmt == ModelFormat.ONNX and source_onnx is not None:
            total, inside, holders = layers_in_control_flow(source_onnx)
            if inside:
                why = (
                    f": {inside} of its {total} weight layers sit inside {', '.join(holders)}, "
                    "which this quantizer leaves in float"
                )
        raise ConversionError(
            f"not int8: the file has no integer or Q/DQ operators{why} ({size} bytes vs fp32 {fp32_size})"
        )
    if size >= fp32_size:
        raise ConversionError(
            f"not int8: {size} bytes, not smaller than fp32's {fp32_size} (nothing was quantized worth shipping)"
        )
    return notes


def _onnx_fp16_values(path: Path) -> int:
    """float16 initializers, Constant values, casts to float16 and float16-typed values, anywhere."""
    import onnx

    fp16 = onnx.TensorProto.FLOAT16
    model = onnx.load(str(path))
    count = sum(1 for i in model.graph.initializer if i.data_type == fp16)
    for node, _ in onnx_nodes(model.graph):
        for attribute in node.attribute:
            if node.op_type == "Cast" and attribute.name == "to" and attribute.i == fp16:
                count += 1
            elif attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == fp16:
                count += 1
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    return count + sum(1 for v in values if v.type.tensor_type.elem_type == fp16)


def _openvino_fp16_constants(xml_path: Path) -> int:
    return sum(
        1
        for layer in ET.parse(xml_path).getroot().iter("layer")
        if layer.get("type") == "Const"
        and (data := layer.find("data")) is not None
        and data.get("element_type") == "f16"
    )


def _tflite_fp16_tensors(path: Path) -> int | None:
    """float16 tensors an op reads or writes (weights stored as fp16, or fp16 compute); None without LiteRT."""
    try:
        from edgesdk.converters.tflite_graph import fp16_content
    except ImportError:
        return None
    content = fp16_content(path.read_bytes())
    return content.stored_weights + content.computed


def check_fp16(fmt: ModelFormat, files: Mapping[str, Path], fp32_size: int) -> None:
    """Raise ConversionError unless the fp16 variant holds float16 content: a converter that finds
    nothing to cast (ai-edge-quantizer's float casting on ops it does not cover) writes the fp32
    model again, bit-identical; shipped as "fp16" it would be a ladder step that changes nothing."""
    size = sum(p.stat().st_size for p in files.values())
    if fmt == ModelFormat.ONNX:
        found: int | None = _onnx_fp16_values(files["model.onnx"])
    elif fmt == ModelFormat.OPENVINO:
        found = _openvino_fp16_constants(files["model.xml"])
    elif fmt == ModelFormat.TFLITE:
        found = _tflite_fp16_tensors(files["model.tflite"])
    else:
        found = None  # Core ML: its fp16 is a compute precision of the spec, not tensors to count
    if found == 0:
        raise ConversionError(
            f"not fp16: the file holds no float16 tensor ({size} bytes vs fp32 {fp32_size}); "
            "the converter cast nothing and its outputs would be fp32's"
        )


def check_fp16_onnx(model: Any) -> None:
    """Every sub-graph of the fp16 model type-checks (the converter can leave an If branch mixing
    float and float16); ConversionError with ONNX's own reason otherwise."""
    import onnx

    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConversionError(f"fp16 conversion leaves inconsistent types: {first}") from exc
