"""ConversionReport: what ``edgesdk convert`` leaves in ``report.json`` of its output dir.

It is also the hand-over to ``edgesdk package``: the packager reads the shipped variants
(their files, I/O signatures and accuracy results) from here, so the two stay in step.

Output directory layout::

    OUT/
      report.json          this document
      report.html          the same, for people, with plots
      golden.npz           reference inputs and outputs for the on-device smoke test
      artifacts/<variant-id>/<files>   e.g. model.onnx, model.tflite, model.xml + model.bin, model.mlpackage/
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from edgesdk.schemas.base import SCHEMA_VERSION, Schema
from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName
from edgesdk.schemas.manifest import AccuracyResult, TensorSpec


class VariantMeasurements(Schema):
    """Measured on the converting host in the runtime the device will use."""

    load_ms: float | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    peak_rss_mb: float | None = None
    convert_s: float | None = Field(None, description="wall time of the conversion on the converting host")
    note: str = ""


class ShippedVariant(Schema):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="e.g. 'onnx-int8'")
    format: ModelFormat
    precision: Precision
    runtime: RuntimeName
    files: list[str] = Field(min_length=1, description="paths relative to the output dir")
    size: int = Field(ge=0, description="bytes, all files together")
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    accuracy: AccuracyResult | None = Field(None, description="None only where the runtime cannot run here")
    quantization_method: str | None = None
    measurements: VariantMeasurements = Field(default_factory=VariantMeasurements)
    validation: Literal["numeric", "spec-only"] = "numeric"


class RejectedVariant(Schema):
    format: ModelFormat
    precision: Precision
    reason: str = Field(description="e.g. 'int8 dropped: top-1 agreement 91% < gate 98%'")


class ConversionReport(Schema):
    schema_version: Literal[1] = SCHEMA_VERSION
    model_name: str
    source: str = Field(description="what was converted: a path or module:factory")
    profile: str
    created: datetime
    metric: Literal["top1", "cosine", "max_abs"]
    gate: float
    variants: list[ShippedVariant] = Field(default_factory=list)
    rejected: list[RejectedVariant] = Field(default_factory=list)
    decisions: list[str] = Field(default_factory=list, description="the planner's reasoning, in order")
    golden: str | None = Field("golden.npz", description="reference inputs/outputs file, relative")
