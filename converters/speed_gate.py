"""Speed is part of the gate: which shipped variant is a step on the governor's ladder.

The governor steps down from fp32 to fp16 to int8 when the device is hot, on battery or
late. A step is worth taking only if it is faster: an int8 that runs slower than its fp32
(dynamic int8 lowering convs to ConvInteger, QDQ that the runtime does not fuse) would make
the device hotter and later. So each variant gets a role, from the latencies measured side by
side in its runtime:

* ``reference`` — the fp32 of its runtime (the top of the ladder),
* ``speed`` — faster than the reference (median < 0.95×),
* ``size-only`` — not faster: shipped for its size, the agent does not put it on the ladder
  (fp16 measured on a host of another CPU architecture stays a step: the host emulates fp16),
* ``off`` — not validated (Core ML on Linux): never on the ladder.

The latencies are this host's, unless the profile's ``measured:`` section has this model
(``edgesdk profiles import-measurements``: what devices of this kind timed on themselves with
``edge-agent profile``): then the devices' own medians decide, and the report says so. Figures
taken under emulation (the arm64 lane) are never used for speed. When the profile's CPU
architecture is not the host's (aarch64 device, x86-64 host) and the devices did not measure it,
the ordering can differ on the device (other kernels, other int8 dot-product instructions): the
report says it is unverified until measured there.
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from edgesdk.schemas.common import ModelFormat, Precision
from edgesdk.schemas.manifest import LadderRole
from edgesdk.schemas.measurements import DeviceMeasurements
from edgesdk.schemas.profile import DeviceProfile

#: A step must be at least this much faster than the reference (timing noise is a few %).
SPEED_STEP_RATIO = 0.95

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


class _Measured(Protocol):
    """What the gate reads of a built variant (pipeline._Built has these)."""

    ladder_role: LadderRole
    latency_basis: str

    @property
    def format(self) -> ModelFormat: ...

    @property
    def precision(self) -> Precision: ...

    @property
    def latency_ms(self) -> float | None: ...

    @property
    def validated(self) -> bool: ...


def host_arch() -> str:
    machine = platform.machine().lower()
    return _ARCH_ALIASES.get(machine, machine)


def device_arch(profile: DeviceProfile) -> str:
    arch = str(profile.cpu.arch)
    return "aarch64" if arch == "arm64-apple" else arch


@dataclass(frozen=True)
class DeviceTimings:
    """What devices of the profile measured of one model: the median over devices of each
    (format, precision)'s fastest variant, and where that comes from (one sentence)."""

    p50_ms: dict[tuple[str, str], float]
    basis: str


def device_timings(profile: DeviceProfile, model: str | None) -> tuple[DeviceTimings | None, list[str]]:
    """The profile's ``measured:`` figures of ``model`` (its newest release measured), preferred to
    host timings; None (and why, for the report) when there are none that can say anything of speed."""
    if not profile.measured or model is None:
        return None, []
    named = [m for m in profile.measured if m.model == model]
    real = [m for m in named if not m.emulated]
    if not real:
        others = sorted({m.model for m in profile.measured if not m.emulated} - {model})
        why = (
            f"{profile.name}'s measured: section has {model} only from emulation (sizes and memory, not speed)"
            if named
            else f"{profile.name}'s measured: section has no figures of {model}"
            + (f" (it has {', '.join(others)})" if others else "")
        )
        return None, [why + "; latency ordering from host timings"]
    release = max(m.release for m in real)
    newest: dict[str, DeviceMeasurements] = {}
    for m in sorted((m for m in real if m.release == release), key=lambda m: m.measured_at):
        newest[m.device_id] = m  # one entry per device: its newest
    per_key: dict[tuple[str, str], list[float]] = {}
    for m in newest.values():
        best: dict[tuple[str, str], float] = {}
        for v in m.variants:
            key = (v.format, v.precision)
            best[key] = min(best.get(key, v.p50_ms), v.p50_ms)
        for key, ms in best.items():
            per_key.setdefault(key, []).append(ms)
    devices = ", ".join(sorted(newest))
    basis = (
        f"device timings: measured on {len(newest)} {profile.name} device(s) ({devices}), {model} release "
        f"{release} (the profile's measured: section, preferred to this host's timings)"
    )
    return DeviceTimings({k: statistics.median(v) for k, v in per_key.items()}, basis), []


def assign_roles(
    variants: Sequence[_Measured], profile: DeviceProfile, host: str | None = None, *, model: str | None = None
) -> list[str]:
    """Set ``ladder_role`` and ``latency_basis`` on each variant; return the report's sentences.

    ``model``: the model's name, to find what devices of the profile measured of it."""
    host = host or host_arch()
    device = device_arch(profile)
    same_arch = host == device
    basis = (
        f"host timings ({host}, the same CPU architecture as {profile.name}'s {device}; other CPUs of it may differ)"
        if same_arch
        else f"host timings ({host}); {profile.name} is {device}: latency ordering unverified until measured on the device"
    )
    timings, lines = device_timings(profile, model)
    unmeasured = False
    by_format: dict[ModelFormat, dict[Precision, _Measured]] = {}
    for v in variants:
        by_format.setdefault(v.format, {})[v.precision] = v
    for fmt, group in by_format.items():
        reference = group.get(Precision.FP32)
        for precision, v in group.items():
            v.latency_basis = basis
            on_device = _device_ratio(timings, fmt, precision) if timings is not None else None
            if v.validated and v is not reference and on_device is not None:
                assert timings is not None
                v.latency_basis = timings.basis
                v.ladder_role = "speed" if on_device < SPEED_STEP_RATIO else "size-only"
                if v.ladder_role == "size-only":
                    lines.append(
                        f"{fmt.value}-{precision.value}: {on_device:.2f}x the fp32 latency on the devices "
                        f"({timings.basis}): a size step only, not on the governor's speed ladder"
                    )
                continue
            if timings is not None and v is reference and (fmt.value, precision.value) in timings.p50_ms:
                v.ladder_role, v.latency_basis = "reference", timings.basis
                continue
            if timings is not None and v.validated:
                v.latency_basis = basis + f"; {fmt.value}-{precision.value} (or its fp32) not in the devices' figures"
                unmeasured = True
            if not v.validated:
                v.ladder_role = "off"
                v.latency_basis = "not run on this host"
                lines.append(f"{fmt.value}-{precision.value}: unvalidated, never on the governor's ladder")
                continue
            if v is reference:
                v.ladder_role = "reference"
                continue
            if reference is None or not reference.latency_ms or not v.latency_ms:
                v.ladder_role = "speed"
                v.latency_basis = basis + "; no fp32 of this runtime to compare with"
                continue
            ratio = v.latency_ms / reference.latency_ms
            if ratio < SPEED_STEP_RATIO:
                v.ladder_role = "speed"
            elif precision == Precision.FP16 and not same_arch:
                # An x86 host has no fp16 arithmetic; an Arm device with FP16 (the profile lists
                # fp16) runs it natively: the host's fp16 timing says nothing about the device.
                v.ladder_role = "speed"
                v.latency_basis = basis + f"; fp16 was {ratio:.2f}x fp32 here, where fp16 is emulated"
            else:
                v.ladder_role = "size-only"
                lines.append(
                    f"{fmt.value}-{precision.value}: {ratio:.2f}x the fp32 latency in its runtime ({basis}): "
                    "a size step only, not on the governor's speed ladder"
                )
    if timings is not None:
        lines.insert(0, f"latency ordering from {timings.basis}")
    if not same_arch and variants and (timings is None or unmeasured):
        lines.append(
            f"latency ordering measured on this {host} host only; {profile.name} is {device}: unverified until "
            "measured on the device"
        )
    return lines


def _device_ratio(timings: DeviceTimings, fmt: ModelFormat, precision: Precision) -> float | None:
    """The devices' median latency of ``fmt``/``precision`` over their fp32's, when both were measured."""
    mine = timings.p50_ms.get((fmt.value, precision.value))
    reference = timings.p50_ms.get((fmt.value, Precision.FP32.value))
    if mine is None or not reference:
        return None
    return mine / reference
