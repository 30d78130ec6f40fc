"""Converter name → ``"module:Class"`` with declared capabilities, imported on first use.

Like Olive's pass registry: the planner reads capabilities (formats, precisions, packages)
without importing torch, OpenVINO or coremltools; a backend module is imported only when a
variant of its format is built. tests/contract runs the same cases against every entry
whose packages are installed.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from functools import cache

from edgesdk.converters.base import Converter, ConverterCapabilities

from edgesdk.errors import BackendUnavailableError, UsageError
from edgesdk.offline import disable_vendor_telemetry
from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName

FP32, FP16, INT8 = Precision.FP32, Precision.FP16, Precision.INT8


@dataclass(frozen=True)
class ConverterEntry:
    target: str
    capabilities: ConverterCapabilities


CONVERTERS: dict[str, ConverterEntry] = {
    "onnx": ConverterEntry(
        "edgesdk.converters.onnx_backend:OnnxConverter",
        ConverterCapabilities(
            format=ModelFormat.ONNX,
            runtime=RuntimeName.ONNXRUNTIME,
            precisions=(FP32, FP16, INT8),
            # All recipes; converters/recipes.py picks those for the model's family.
            int8_methods=(
                "static-qdq-per-channel",
                "static-qdq-percentile",
                "static-qdq-u8",
                "static-qdq-percentile-u8",
                "static-qdq-weight-matmuls",
                "cle-static-qdq",
                "nncf-qdq",
                "dynamic-int8",
                "dynamic-int8-per-channel",
                "weight-only-int8",
            ),
            packages=("onnx", "onnxruntime", "onnxconverter_common"),
            extra="convert",
            sources=("pytorch", "onnx"),
            supports_repair=True,
            # NNCF's ONNX backend also writes QDQ for onnxruntime; it needs edgesdk[convert-openvino].
            # Cross-layer equalization comes from aimet-onnx (edgesdk[convert-aimet]).
            method_packages=(("nncf-qdq", ("nncf",)), ("cle-static-qdq", ("aimet_onnx",))),
        ),
    ),
    "tflite": ConverterEntry(
        "edgesdk.converters.tflite_backend:TFLiteConverter",
        ConverterCapabilities(
            format=ModelFormat.TFLITE,
            runtime=RuntimeName.LITERT,
            precisions=(FP32, FP16, INT8),
            int8_methods=("static-int8-full-integer", "dynamic-int8"),
            packages=("litert_torch", "ai_edge_quantizer", "ai_edge_litert"),
            extra="convert-tflite",
            # ONNX: onnx2torch then litert-torch (converters/onnx2torch_route.py), else onnx2tf
            # in its own venv, as a subprocess (converters/onnx2tf_route.py);
            # .tflite: the file is the fp32 model, ai-edge-quantizer quantizes it.
            sources=("pytorch", "onnx", "tflite"),
            # Layer names of the .tflite do not map back to the source's: when static int8
            # misses the gate, dynamic int8 (float activations) is the fallback instead.
            supports_repair=False,
        ),
    ),
    "openvino": ConverterEntry(
        "edgesdk.converters.openvino_backend:OpenVINOConverter",
        ConverterCapabilities(
            format=ModelFormat.OPENVINO,
            runtime=RuntimeName.OPENVINO,
            precisions=(FP32, FP16, INT8),
            int8_methods=(
                "nncf-ptq",
                "nncf-ptq-bias-correction",
                "nncf-ptq-accuracy-control",
                "nncf-ptq-transformer",
                "nncf-weights-int8",
            ),
            packages=("openvino", "nncf"),
            extra="convert-openvino",
            # .tflite through OpenVINO's TFLite frontend; an IR read as it is.
            sources=("pytorch", "onnx", "tflite", "openvino"),
            supports_repair=True,
        ),
    ),
    "coreml": ConverterEntry(
        "edgesdk.converters.coreml_backend:CoreMLConverter",
        ConverterCapabilities(
            format=ModelFormat.COREML,
            runtime=RuntimeName.COREML,
            precisions=(FP32, FP16, INT8),
            int8_methods=("linear-weights-int8", "palettized-weights-8bit"),
            packages=("coremltools",),
            extra="convert-coreml",
            # PyTorch: torch.jit.trace → coremltools. ONNX: onnx2coreml (coremltools' MIL builder,
            # torch-free) after fixing dynamic dims to the example and folding shape arithmetic.
            sources=("pytorch", "onnx"),
            onnx_route_packages=("onnx2coreml",),
            numeric_validation=False,
        ),
    ),
}

#: The converter that produces each format.
CONVERTER_FOR_FORMAT: dict[ModelFormat, str] = {e.capabilities.format: n for n, e in CONVERTERS.items()}


def missing_packages(name: str, source_kind: str = "pytorch") -> list[str]:
    """Packages the converter needs for this kind of source that are not installed (nothing is imported)."""
    caps = CONVERTERS[name].capabilities
    missing = []
    for package in caps.packages + (caps.onnx_route_packages if source_kind == "onnx" else ()):
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(package)
    return missing


def missing_method_packages(name: str, method: str) -> list[str]:
    """Packages a single int8 method of the converter needs that are not installed."""
    wanted = dict(CONVERTERS[name].capabilities.method_packages).get(method, ())
    missing = []
    for package in wanted:
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(package)
    return missing


def installed_converters() -> list[str]:
    """Names of converters whose packages are all installed."""
    return [name for name in CONVERTERS if not missing_packages(name)]


@cache
def get_converter(name: str) -> Converter:
    """The converter backend by name, imported now."""
    if name not in CONVERTERS:
        raise UsageError(f"unknown converter {name!r}; known: {', '.join(CONVERTERS)}")
    missing = missing_packages(name)
    if missing:
        extra = CONVERTERS[name].capabilities.extra
        raise BackendUnavailableError(f"converter {name!r} needs {', '.join(missing)}: pip install 'edgesdk[{extra}]'")
    disable_vendor_telemetry()
    module_name, class_name = CONVERTERS[name].target.split(":")
    converter: Converter = getattr(importlib.import_module(module_name), class_name)()
    return converter
