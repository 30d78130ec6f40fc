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

The latencies are this host's. When the profile's CPU architecture is not the host's
(aarch64 device, x86-64 host), the ordering can differ on the device (other kernels, other
int8 dot-product instructions): the report says it is unverified until measured there.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Protocol

from edgesdk.schemas.common import ModelFormat, Precision
from edgesdk.schemas.manifest import LadderRole
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


def assign_roles(variants: Sequence[_Measured], profile: DeviceProfile, host: str | None = None) -> list[str]:
    """Set ``ladder_role`` and ``latency_basis`` on each variant; return the report's sentences."""
    host = host or host_arch()
    device = device_arch(profile)
    same_arch = host == device
    basis = (
        f"host timings ({host}, the same CPU architecture as {profile.name}'s {device}; other CPUs of it may differ)"
        if same_arch
        else f"host timings ({host}); {profile.name} is {device}: latency ordering unverified until measured on the device"
    )
    lines: list[str] = []
    by_format: dict[ModelFormat, dict[Precision, _Measured]] = {}
    for v in variants:
        by_format.setdefault(v.format, {})[v.precision] = v
    for fmt, group in by_format.items():
        reference = group.get(Precision.FP32)
        for precision, v in group.items():
            v.latency_basis = basis
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
    if not same_arch and variants:
        lines.append(
            f"latency ordering measured on this {host} host only; {profile.name} is {device}: unverified until "
            "measured on the device"
        )
    return lines
