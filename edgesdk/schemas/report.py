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
from edgesdk.schemas.manifest import AccuracyResult, LadderRole, TensorSpec


class VariantMeasurements(Schema):
    """Measured on the converting host in the runtime the device will use."""

    load_ms: float | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    peak_rss_mb: float | None = None
    convert_s: float | None = Field(None, description="wall time of the conversion on the converting host")
    note: str = ""


class OutputAccuracy(Schema):
    """One output's figure against its own gate (converters/output_metrics.py says which metric)."""

    output: str
    metric: Literal["top1", "cosine", "abs", "iou", "ctc", "max_abs"]
    value: float = Field(description="what the gate reads: an agreement, or a per-sample figure's tail")
    statistic: str = Field(description="agreement, worst sample, 5th/95th percentile or worst case")
    mean: float = Field(description="the per-sample mean, shown beside the tail")
    bound: float | None = Field(None, description="95% bound of value (upper for abs, an error), None for max_abs")
    threshold: float = Field(description="minimum, or for abs/max_abs the tolerance in the output's units")
    passed: bool
    verdict: Literal["pass", "fail", "inconclusive"]
    samples: int = Field(ge=0)
    why: str = Field("", description="why this metric was chosen for this output")
    note: str = ""


class TaskFigure(Schema):
    """One task-level figure of the end-to-end gate: what it gates on (the tail: the worst file,
    a named percentile, or a share) and the mean beside it."""

    name: str = Field(description="top1, recall, precision, box_iou, mask_iou, exact, cer or cosine")
    value: float = Field(description="what the gate reads")
    statistic: str = Field(description="worst sample, pN, share of samples, or 95% Wilson bound")
    mean: float
    gate: float
    higher_is_better: bool = True
    samples: int = Field(ge=0)
    worst: str | None = Field(None, description="the file with the worst figure")
    passed: bool


class TaskAccuracy(Schema):
    """A variant's task results through the bundle's whole pipeline (decode → pre → model → post,
    run on the converting host) against the user's own results (converters/end_to_end.py)."""

    metric: Literal["top1_label", "boxes", "mask", "ctc", "embedding"] = "top1_label"
    figures: list[TaskFigure] = Field(default_factory=list, description="every task-level gate's reading")
    agreement: float = Field(
        description="share of the raw files whose top-1 label is the user's (other kinds: that pass every gate)"
    )
    lower_bound: float = Field(description="one-sided 95% Wilson lower bound of agreement")
    gate: float
    samples: int = Field(ge=0, description="raw files judged")
    samples_needed: int | None = Field(None, description="files at which an inconclusive agreement would tell")
    score_diff: float | None = Field(
        None, description="|score - the user's score| of the agreed label: its tail (worst file, or 95th percentile)"
    )
    score_diff_mean: float | None = None
    score_statistic: str | None = None
    score_tolerance: float | None = None
    passed: bool
    verdict: Literal["pass", "fail", "inconclusive"]
    disagreements: list[str] = Field(default_factory=list, description="the first files answered differently")
    note: str = ""


class EndToEndCheck(Schema):
    """What the end-to-end gate read: the raw files, the user's reference and the pipeline."""

    images: str = Field(description="the folder of raw validation files")
    files: int = Field(ge=1)
    reference: str = Field(description="the user's function (MODULE:FUNCTION) or their JSON of labels")
    pipeline_sha256: str = Field(description="the validated pipeline (labels included); package signs only this one")
    gate: float
    score_tolerance: float | None = None
    kind: str = Field("classes", description="the pipeline's post kind: what the task results are")
    gates: dict[str, float] = Field(default_factory=dict, description="every task-level gate and its threshold")


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
    output_accuracy: list[OutputAccuracy] = Field(
        default_factory=list, description="every output against its own metric; the variant passes when all do"
    )
    quantization_method: str | None = None
    measurements: VariantMeasurements = Field(default_factory=VariantMeasurements)
    #: unvalidated: it could not run here (Core ML on Linux; its spec and size were checked).
    #: "spec-only" is how older reports said the same.
    validation: Literal["numeric", "unvalidated", "spec-only"] = "numeric"
    task_accuracy: TaskAccuracy | None = Field(
        None, description="the end-to-end gate through the bundle's pipeline (convert --pipeline --reference)"
    )
    ladder_role: LadderRole = Field(
        "speed",
        description="reference (fp32 of its runtime), speed (faster than the reference), size-only (not faster: "
        "shipped for size, the governor does not step down to it for speed), off (unvalidated: never on the ladder)",
    )
    latency_basis: str = Field(
        "", description="where the latency ordering was measured and whether it holds on the device"
    )


class RecipeTrial(Schema):
    """One int8 (or fp16/fp32) build that was validated: kept, or dropped and why."""

    format: ModelFormat
    precision: Precision
    method: str | None = None
    kept_float: int = Field(0, ge=0, description="layers kept in float (repair)")
    accuracy: float | None = None
    lower_bound: float | None = None
    verdict: Literal["pass", "fail", "inconclusive"] | None = None
    size: int | None = Field(None, ge=0)
    latency_p50_ms: float | None = None
    outcome: Literal["kept", "dropped", "failed"]
    reason: str = ""


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
    family: str | None = Field(None, description="transformer, convnet or other: which int8 recipes were tried")
    recipes: list[RecipeTrial] = Field(default_factory=list, description="every variant built and validated")
    host_arch: str | None = Field(None, description="the CPU the latencies were measured on")
    device_arch: str | None = None
    golden: str | None = Field("golden.npz", description="reference inputs/outputs file, relative")
    end_to_end: EndToEndCheck | None = Field(None, description="the end-to-end gate's inputs, when it ran")
