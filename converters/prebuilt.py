"""Prebuilt sources: a ``.tflite`` file, an OpenVINO IR (``.xml`` + ``.bin``), or any artifact
shipped as it is (``--as-is``).

A ``.tflite`` source is read and validated in LiteRT (its signature names the tensors, or
without one its tensor details do: edgesdk/runtimes/litert_backend.py); its
float model feeds the TFLite converter (fp16 and int8 through ai-edge-quantizer, which works on
``.tflite``) and OpenVINO's TFLite frontend, which reads ``.tflite`` directly. An IR feeds the
OpenVINO converter (NNCF quantizes an ``ov.Model``). The reference outputs come from the
source itself, in its own runtime.
(``--as-is``: converters/as_is.py.)
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
from edgesdk.converters.base import SourceModel

from edgesdk.errors import ModelError, RuntimeBackendError
from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName

#: What ``edgesdk convert`` takes, for the error that lists it.
ACCEPTED = (
    "an .onnx file, a .tflite file, an OpenVINO IR .xml (with its .bin beside it), "
    "or module:factory returning an nn.Module; --as-is ships an .onnx, .tflite or .xml as it is"
)

#: The file suffix of each prebuilt format and the runtime that validates it here.
PREBUILT = {
    ".onnx": (ModelFormat.ONNX, RuntimeName.ONNXRUNTIME),
    ".tflite": (ModelFormat.TFLITE, RuntimeName.LITERT),
    ".xml": (ModelFormat.OPENVINO, RuntimeName.OPENVINO),
}


def is_prebuilt_path(model: object) -> bool:
    return isinstance(model, (str, Path)) and Path(str(model)).suffix in (".tflite", ".xml")


def variant_files(source: SourceModel) -> dict[str, Path]:
    """The source's files under the names a variant of its format has (model.tflite, model.xml/.bin)."""
    path = source.onnx_path
    if source.kind == "openvino":
        return {"model.xml": path, "model.bin": path.with_suffix(".bin")}
    if source.kind == "tflite":
        return {"model.tflite": path}
    return {"model.onnx": path}


def _load_here(runtime: RuntimeName, files: dict[str, Path], where: str) -> object:
    from edgesdk.runtimes import load_variant

    options = {"INFERENCE_PRECISION_HINT": "f32"} if runtime == RuntimeName.OPENVINO else None
    try:
        return load_variant(runtime, {n: p.read_bytes() for n, p in files.items()}, options=options)
    except RuntimeBackendError as exc:
        raise ModelError(f"model {where}: {runtime.value} cannot load it: {exc}") from exc


def read_prebuilt(path: Path, workdir: Path, name: str | None) -> SourceModel:
    """A .tflite or IR source, copied into ``workdir``, its I/O read in its own runtime."""
    if not path.is_file():
        raise ModelError(f"model {path}: file not found")
    fmt, runtime = PREBUILT[path.suffix]
    if fmt == ModelFormat.OPENVINO:
        weights = path.with_suffix(".bin")
        if not weights.is_file():
            raise ModelError(f"model {path}: an OpenVINO IR needs its weights {weights.name} beside it")
        copy = workdir / "source.xml"
        shutil.copyfile(weights, workdir / "source.bin")
    else:
        copy = workdir / "source.tflite"
    shutil.copyfile(path, copy)
    kind = "openvino" if fmt == ModelFormat.OPENVINO else "tflite"
    probe = SourceModel(name or path.stem, str(path), copy, [], [], {}, source_kind=kind)
    model = _load_here(runtime, variant_files(probe), str(path))
    inputs, outputs = list(model.inputs), list(model.outputs)  # type: ignore[attr-defined]
    model.close()  # type: ignore[attr-defined]
    return SourceModel(
        name=name or path.stem,
        source=str(path),
        onnx_path=copy,
        inputs=inputs,
        outputs=outputs,
        example={},
        source_kind=kind,
        native_precision=native_precision(fmt, variant_files(probe)),
    )


def native_precision(fmt: ModelFormat, files: dict[str, Path]) -> Precision:
    """int8 when the file holds integer or Q/DQ ops, fp16 when its weights are float16, else fp32."""
    from edgesdk.converters import precision_check

    if fmt == ModelFormat.TFLITE:
        from ai_edge_litert.interpreter import Interpreter

        details = Interpreter(model_content=files["model.tflite"].read_bytes()).get_tensor_details()
        dtypes = {np.dtype(d["dtype"]) for d in details}
        if any(
            np.dtype(d["dtype"]) in (np.int8, np.uint8, np.int16) and d["quantization_parameters"]["scales"].size
            for d in details
        ):
            return Precision.INT8
        return Precision.FP16 if np.dtype(np.float16) in dtypes else Precision.FP32
    if fmt == ModelFormat.OPENVINO:
        elements = set()
        for layer in ET.parse(files["model.xml"]).getroot().iter("layer"):
            data = layer.find("data")
            if layer.get("type") == "FakeQuantize":
                return Precision.INT8
            if layer.get("type") == "Const" and data is not None:
                elements.add(data.get("element_type", ""))
        if elements & {"i8", "u8", "i4", "u4"}:
            return Precision.INT8
        return Precision.FP16 if "f16" in elements else Precision.FP32
    import onnx

    model = onnx.load(str(files["model.onnx"]))
    for node, _ in precision_check.onnx_nodes(model.graph):
        if node.op_type in precision_check.ONNX_INTEGER_OPS or node.op_type.startswith("QLinear"):
            return Precision.INT8
    if any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer):
        return Precision.FP16
    return Precision.FP32


def float_source(source: SourceModel) -> Path:
    """The file a converter starts from: the source itself, or for a .tflite storing float16
    weights that LiteRT expands at load (MediaPipe's), a copy with them expanded ahead of time
    (tflite_graph.dequantize_fp16_weights: the same values), so that "fp32" is fp32 in every
    format and int8 is measured against it. Written once, beside the source's copy."""
    if source.kind != "tflite":
        return source.onnx_path
    from edgesdk.converters.tflite_graph import dequantize_fp16_weights, fp16_content

    expanded = source.onnx_path.with_name(source.onnx_path.stem + ".fp32.tflite")
    if expanded.is_file():
        return expanded
    given = source.onnx_path.read_bytes()
    if not fp16_content(given).storage_only:
        return source.onnx_path
    expanded.write_bytes(dequantize_fp16_weights(given))
    return expanded


def reference_model(source: SourceModel) -> object:
    """The source itself loaded in its own runtime, for the reference outputs."""
    runtime = RuntimeName.OPENVINO if source.kind == "openvino" else RuntimeName.LITERT
    return _load_here(runtime, variant_files(source), source.source)


def tflite_signature_names(path: Path) -> dict[str, str]:
    """Tensor name in the .tflite ("serving_default_input_2:0") → its serving-signature name
    ("input_2"): OpenVINO's TFLite frontend names ports by the former, edgesdk by the latter."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=path.read_bytes())
    signatures = interpreter.get_signature_list()
    if not signatures:
        return {}
    runner = interpreter.get_signature_runner(next(iter(signatures)))
    tensors = {t["index"]: t["name"] for t in interpreter.get_tensor_details()}
    names: dict[str, str] = {}
    for details in (runner.get_input_details(), runner.get_output_details()):
        for name, detail in details.items():
            if detail["index"] in tensors:
                names[tensors[detail["index"]]] = name
    return names
