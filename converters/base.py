"""The shape every converter backend has: a Protocol, its capabilities, its input and output.

A converter turns a :class:`SourceModel` into one artifact at one precision. It does not
validate, budget or decide what to build: the planner decides, the pipeline validates every
artifact in the device's runtime and applies the gates. That keeps backends small and alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from edgesdk.converters.input_spec import InputLayout

from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName
from edgesdk.schemas.manifest import TensorSpec


@dataclass(frozen=True)
class SourceModel:
    """The model to convert, read once: an fp32 ONNX file, plus the nn.Module when given one.

    A ``.tflite`` or OpenVINO IR source has no ONNX file: ``onnx_path`` is then that native
    file (``model.xml`` beside its ``.bin``) and ``source_kind`` says so; only the converters
    whose ``sources`` list that kind are planned for it.
    """

    name: str
    source: str
    onnx_path: Path
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    example: dict[str, np.ndarray]
    torch_module: Any | None = None
    #: Where each input's and output's samples are (input_spec.py); set once the data is read.
    layout: InputLayout = field(default_factory=InputLayout)
    #: "tflite" or "openvino" for a prebuilt source; "" for ONNX/PyTorch (told apart by the module).
    source_kind: str = ""
    #: The source's own precision when it is already quantized or fp16 (a prebuilt int8 .tflite).
    native_precision: Precision = Precision.FP32
    #: What reading the source changed in it, for the report (source.read_onnx: folded Constant weights).
    notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """``"pytorch"``, ``"onnx"``, ``"tflite"`` or ``"openvino"``: decides which routes a converter can take."""
        if self.source_kind:
            return self.source_kind
        return "pytorch" if self.torch_module is not None else "onnx"


@dataclass(frozen=True)
class ConversionRequest:
    """One artifact to build: a precision and, for quantization, a method and the data for it."""

    source: SourceModel
    precision: Precision
    workdir: Path
    method: str | None = None
    calibration: Mapping[str, np.ndarray] | None = None
    #: Layers to keep in float (accuracy-aware repair), by the names ``quantizable_layers`` gives.
    keep_float: Sequence[str] = ()
    #: Each output's metric (edgesdk.quality.output_metrics.OutputMetric, by output name), for a
    #: quantizer that checks accuracy itself (OpenVINO's accuracy control); None: chosen there.
    metrics: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ConvertedArtifact:
    """What a converter wrote: variant file name → path, and how it was made."""

    files: dict[str, Path]
    precision: Precision
    method: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.files.values())


@dataclass(frozen=True)
class ConverterCapabilities:
    """Declared in the registry so the planner can reason without importing the backend."""

    format: ModelFormat
    runtime: RuntimeName
    precisions: tuple[Precision, ...]
    #: int8 methods worth measuring against each other, in order of preference.
    int8_methods: tuple[str, ...]
    #: Python packages (import names) the converter needs on the host.
    packages: tuple[str, ...]
    #: The pip extra that installs them.
    extra: str
    #: Which sources it can take: "pytorch", "onnx".
    sources: tuple[str, ...]
    #: Extra packages needed only for an ONNX source (a separate ONNX route).
    onnx_route_packages: tuple[str, ...] = ()
    #: Extra packages of single int8 methods: (method, packages) pairs; the planner skips a
    #: method whose packages are missing.
    method_packages: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Whether variants can run here (False: spec-only validation).
    numeric_validation: bool = True
    #: Whether ``keep_float`` is honoured (accuracy-aware repair).
    supports_repair: bool = False


class Converter(Protocol):
    """One backend: ``converters/<format>_backend.py`` holds a class of this shape."""

    name: str
    capabilities: ConverterCapabilities

    def convert(self, request: ConversionRequest) -> ConvertedArtifact:
        """Build the artifact under ``request.workdir``; raise ConversionError/UnsupportedOpError."""
        ...

    def quantizable_layers(self, source: SourceModel) -> list[str]:
        """Names of the layers ``keep_float`` can name (empty when repair is not supported)."""
        ...
