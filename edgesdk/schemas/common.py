"""Vocabulary shared by profiles, manifests and the agent: formats, runtimes, precisions."""

from __future__ import annotations

from enum import Enum


class ModelFormat(str, Enum):
    """On-device artifact formats."""

    ONNX = "onnx"
    TFLITE = "tflite"
    OPENVINO = "openvino"
    COREML = "coreml"


class RuntimeName(str, Enum):
    """Inference runtimes an agent can load artifacts into."""

    ONNXRUNTIME = "onnxruntime"
    LITERT = "litert"  # ai-edge-litert, the successor of tflite-runtime
    TFLITE_RUNTIME = "tflite-runtime"  # legacy fallback on old devices (numpy < 2 only)
    OPENVINO = "openvino"
    COREML = "coreml"


#: The format each runtime executes.
RUNTIME_FORMAT: dict[RuntimeName, ModelFormat] = {
    RuntimeName.ONNXRUNTIME: ModelFormat.ONNX,
    RuntimeName.LITERT: ModelFormat.TFLITE,
    RuntimeName.TFLITE_RUNTIME: ModelFormat.TFLITE,
    RuntimeName.OPENVINO: ModelFormat.OPENVINO,
    RuntimeName.COREML: ModelFormat.COREML,
}


class Precision(str, Enum):
    """Numeric precision of a model variant, highest first in ``PRECISION_LADDER``."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    INT4 = "int4"


#: Order in which the governor steps down (and back up).
PRECISION_LADDER: tuple[Precision, ...] = (
    Precision.FP32,
    Precision.BF16,
    Precision.FP16,
    Precision.INT8,
    Precision.INT4,
)
