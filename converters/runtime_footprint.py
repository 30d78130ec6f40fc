"""What each runtime costs on the board, from the profile's ``measured:`` section, against its budgets.

``edge-agent profile`` records, per runtime, the resident memory its import added and the disk
its installed distribution takes (``installed_mb``) — on the device, or in the arm64 lane (sizes
and memory hold under emulation; docs/devices.md). The planner counts them: a runtime whose
import alone takes the model RAM budget, or whose files do not fit the disk left for runtimes
(``storage.runtime_budget_mb``, or the whole ``storage_gb``; runtimes in the profile's order of
preference), is not planned; and a built variant's peak memory is counted with its runtime's.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgesdk.schemas.common import RuntimeName
from edgesdk.schemas.profile import DeviceProfile


@dataclass(frozen=True)
class Footprint:
    """The largest figures any device of the profile measured for one runtime."""

    runtime: str
    rss_mb: float | None
    installed_mb: float | None
    devices: int

    def describe(self) -> str:
        parts = []
        if self.installed_mb is not None:
            parts.append(f"{self.installed_mb:.0f} MB installed")
        if self.rss_mb is not None:
            parts.append(f"{self.rss_mb:.0f} MB RSS after import")
        return ", ".join(parts) + f" (measured on {self.devices} device(s))"


def runtime_footprints(profile: DeviceProfile) -> dict[str, Footprint]:
    """Per runtime name, the largest RSS and installed size in the profile's measured: section."""
    seen: dict[str, list[tuple[float, float | None, str]]] = {}
    for document in profile.measured:
        for footprint in document.runtimes:
            seen.setdefault(footprint.runtime, []).append(
                (footprint.rss_mb, footprint.installed_mb, document.device_id)
            )
    result = {}
    for runtime, rows in seen.items():
        sizes = [size for _, size, _ in rows if size is not None]
        result[runtime] = Footprint(
            runtime=runtime,
            rss_mb=max(max(rss for rss, _, _ in rows), 0.0),
            installed_mb=max(sizes) if sizes else None,
            devices=len({device for _, _, device in rows}),
        )
    return result


def runtime_storage_budget_mb(profile: DeviceProfile) -> float:
    budget = profile.storage.runtime_budget_mb
    return float(budget) if budget is not None else profile.storage.storage_gb * 1024


def runtimes_that_do_not_fit(profile: DeviceProfile) -> tuple[dict[RuntimeName, str], list[str]]:
    """Runtimes of the profile that do not fit the board (-> one line with the figures), and the
    planner's sentences about the ones that do."""
    footprints = runtime_footprints(profile)
    if not footprints:
        return {}, []
    ram = profile.memory.model_ram_budget_mb
    left = runtime_storage_budget_mb(profile)
    storage_name = "runtime storage budget" if profile.storage.runtime_budget_mb is not None else "storage"
    refused: dict[RuntimeName, str] = {}
    lines: list[str] = []
    for support in profile.runtimes:
        runtime = support.runtime
        if runtime in refused:
            continue
        footprint = footprints.get(runtime.value)
        if footprint is None:
            continue
        if footprint.rss_mb is not None and footprint.rss_mb >= ram:
            refused[runtime] = (
                f"runtime {runtime.value} does not fit {profile.name}: {footprint.rss_mb:.0f} MB RSS after import "
                f">= the model RAM budget {ram} MB, before any model ({footprint.describe()})"
            )
        elif footprint.installed_mb is not None and footprint.installed_mb > left:
            refused[runtime] = (
                f"runtime {runtime.value} does not fit {profile.name}: {footprint.installed_mb:.0f} MB installed "
                f"> {left:.0f} MB of {storage_name} left for it ({footprint.describe()})"
            )
        else:
            if footprint.installed_mb is not None:
                left -= footprint.installed_mb
            lines.append(
                f"runtime {runtime.value} on {profile.name}: {footprint.describe()}; counted against its budgets"
            )
    return refused, lines
