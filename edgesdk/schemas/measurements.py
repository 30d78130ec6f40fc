"""What a device measured about the variants of a model on itself (``edge-agent profile``).

Written by the agent to its data dir, shown in ``/v1/status``; host code reads the same document
(a fleet importing device figures into a profile), so it lives here and not in the agent.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from edgesdk.schemas.base import SCHEMA_VERSION, Schema


class VariantMeasurement(Schema):
    """One variant, timed on the device: loading it, then ``runs`` inferences after ``warmup``."""

    variant: str
    runtime: str
    precision: str
    format: str
    load_ms: float = Field(ge=0, description="decrypt + create the runtime session, in memory")
    rss_mb: float = Field(description="resident memory the loaded variant added (may be ~0 or negative: heap reuse)")
    warmup: int = Field(ge=0)
    runs: int = Field(ge=1)
    batch: int = Field(ge=1, description="samples per inference (the golden set's first sample(s))")
    p50_ms: float = Field(ge=0)
    p95_ms: float = Field(ge=0)
    mean_ms: float = Field(ge=0)


class RuntimeFootprint(Schema):
    """What importing a runtime costs on the device, measured before any variant is loaded
    (so the first variant's figures do not carry the library)."""

    runtime: str
    import_ms: float = Field(ge=0)
    rss_mb: float = Field(description="resident memory the import added")
    installed_mb: float | None = Field(
        None, ge=0, description="disk the runtime's installed distribution takes (its files, as pip installed them)"
    )


class DeviceMeasurements(Schema):
    """Every variant of one model on one device, and the precision ladder those figures give."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["device-measurements"] = "device-measurements"
    device_id: str
    profile: str
    machine: str = Field(description="platform.machine() of the device, e.g. aarch64")
    emulated: bool = Field(
        False,
        description="measured under emulation (qemu-user: the arm64 lane): sizes and memory hold, timings do not, "
        "so the planner never takes speed from it",
    )
    model: str
    version: str
    release: int
    measured_at: datetime
    runtimes: list[RuntimeFootprint] = Field(default_factory=list)
    variants: list[VariantMeasurement] = Field(min_length=1)
    speed_ladder: list[str] = Field(
        description="variant ids the governor steps through, highest precision first: a lower "
        "precision is a step only when it measured faster than the step above it"
    )
    not_steps: dict[str, str] = Field(default_factory=dict, description="variant id -> why it is not a step")

    def summary(self) -> MeasuredSummary:
        """The figures telemetry carries: median latency per variant and the ladder they give."""
        return MeasuredSummary(
            model=self.model,
            release=self.release,
            measured_at=self.measured_at,
            p50_ms={m.variant: m.p50_ms for m in self.variants},
            load_ms={m.variant: m.load_ms for m in self.variants},
            rss_mb={m.variant: m.rss_mb for m in self.variants},
            speed_ladder=list(self.speed_ladder),
        )


class MeasuredSummary(Schema):
    """What telemetry says of the device's own measurements (the whole document stays on the device,
    in ``/v1/status`` and ``measurements.json``, for ``edgesdk profiles import-measurements``)."""

    model: str
    release: int
    measured_at: datetime
    p50_ms: dict[str, float] = Field(default_factory=dict, description="variant id -> median latency")
    load_ms: dict[str, float] = Field(default_factory=dict)
    rss_mb: dict[str, float] = Field(default_factory=dict)
    speed_ladder: list[str] = Field(default_factory=list)
