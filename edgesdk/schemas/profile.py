"""DeviceProfile: what a device is, as far as deploying a model onto it matters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, HttpUrl, model_validator

from edgesdk.schemas.base import SCHEMA_VERSION, Schema
from edgesdk.schemas.common import ModelFormat, Precision, RuntimeName
from edgesdk.schemas.measurements import DeviceMeasurements

CpuArch = Literal["aarch64", "armv7l", "x86_64", "arm64-apple"]


class Platform(Schema):
    """The OS image of the device: decides which wheels an offline install image needs."""

    os: str = Field(description="OS image, e.g. 'Raspberry Pi OS bookworm (64-bit)'")
    arch: CpuArch
    glibc: str | None = Field(None, description="glibc version, e.g. '2.36'; None where not glibc")
    python: str | None = Field(None, description="system Python, e.g. '3.11'; None if the agent cannot run there")
    wheel_platforms: list[str] = Field(
        default_factory=list,
        description="pip --platform tags, highest glibc first (pip matches them exactly)",
    )


class Cpu(Schema):
    model: str
    arch: CpuArch
    cores: int = Field(gt=0)
    max_freq_mhz: int = Field(gt=0)
    isa_features: list[str] = Field(default_factory=list, description="e.g. neon, asimddp, avx2, avx512_vnni")


class Memory(Schema):
    ram_mb: int = Field(gt=0, description="physical RAM")
    model_ram_budget_mb: int = Field(gt=0, description="peak RAM a model may use while loaded and running")


class Storage(Schema):
    storage_gb: float = Field(gt=0, description="typical storage (SD card, eMMC, NVMe)")
    max_artifact_mb: float = Field(gt=0, description="largest single model artifact we may ship")
    runtime_budget_mb: float | None = Field(
        None,
        gt=0,
        description="disk the agent's runtimes may take (their installed wheels); None: the whole storage_gb",
    )


class Accelerator(Schema):
    name: str
    kind: Literal["gpu", "igpu", "npu", "tpu", "dsp", "ane"]
    tops_int8: float | None = Field(None, ge=0, description="peak INT8 TOPS per vendor datasheet")
    precisions: list[Precision] = Field(description="precisions this accelerator runs well")


class RuntimeSupport(Schema):
    """A runtime the device can use, with what it can run well there."""

    runtime: RuntimeName
    format: ModelFormat
    execution_providers: list[str] = Field(
        default_factory=list,
        description="onnxruntime EPs, LiteRT delegates or OpenVINO devices, preferred first",
    )
    precisions: list[Precision] = Field(description="precisions worth shipping for this runtime, best first")


class Thermal(Schema):
    """Temperatures in °C. The governor steps down at ``step_down_c``, before ``throttle_c``."""

    sensor_hint: str = Field(description="where the temperature is read, e.g. sysfs thermal_zone0")
    throttle_c: float = Field(description="the hardware or firmware starts throttling here")
    critical_c: float = Field(description="the device shuts down here")
    step_down_c: float = Field(description="governor steps precision down at or above this")
    step_up_c: float = Field(description="governor steps precision up at or below this (hysteresis)")
    min_dwell_s: float = Field(30.0, ge=0, description="minimum time between two switches")

    @model_validator(mode="after")
    def _ordered(self) -> Thermal:
        if not (self.step_up_c < self.step_down_c < self.throttle_c <= self.critical_c):
            raise ValueError(
                "thermal points must satisfy step_up_c < step_down_c < throttle_c <= critical_c "
                f"(got {self.step_up_c}, {self.step_down_c}, {self.throttle_c}, {self.critical_c})"
            )
        return self


class PowerMode(Schema):
    name: str
    watts: float | None = Field(None, gt=0)
    description: str = ""


class Power(Schema):
    battery: bool = False
    modes: list[PowerMode] = Field(default_factory=list, description="e.g. Jetson nvpmodel modes")
    default_mode: str | None = None
    on_battery_max_precision: Precision | None = Field(
        None, description="highest precision the governor allows while on battery"
    )

    @model_validator(mode="after")
    def _default_mode_known(self) -> Power:
        names = [m.name for m in self.modes]
        if self.default_mode is not None and self.default_mode not in names:
            raise ValueError(f"default_mode {self.default_mode!r} is not one of the modes {names}")
        return self


class DeviceProfile(Schema):
    """A device as edgesdk needs to know it. Loaded from ``device_profiles/*.yaml``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="profile id, used on the command line")
    display_name: str
    vendor: str
    extends: str | None = Field(None, description="profile this one was derived from")
    description: str = ""
    sources: list[HttpUrl] = Field(min_length=1, description="where the figures come from")
    platform: Platform
    cpu: Cpu
    memory: Memory
    storage: Storage
    accelerators: list[Accelerator] = Field(default_factory=list)
    runtimes: list[RuntimeSupport] = Field(min_length=1)
    thermal: Thermal
    power: Power = Field(default_factory=Power)
    measured: list[DeviceMeasurements] = Field(
        default_factory=list,
        description="figures devices of this kind measured on themselves (edge-agent profile), "
        "imported with `edgesdk profiles import-measurements`; one entry per device, model and release",
    )

    def runtime_for(self, fmt: ModelFormat) -> RuntimeSupport | None:
        """The preferred runtime support entry for a format, if the device runs that format."""
        return next((r for r in self.runtimes if r.format == fmt), None)

    @property
    def formats(self) -> list[ModelFormat]:
        """Formats the device runs, preferred first, without repeats."""
        seen: list[ModelFormat] = []
        for r in self.runtimes:
            if r.format not in seen:
                seen.append(r.format)
        return seen
