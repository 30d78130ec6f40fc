"""The agent's side of the shadow: each model's updater is told the device's free memory budget
and its governor's pressure (one call from the composition root, agent/daemon.py)."""

from __future__ import annotations

from typing import Any

from edgesdk.agent.shadow.pressure import governor_pressure
from edgesdk.agent.shadow.reference import ShadowDevice


def device_for(models: Any, entry: Any) -> ShadowDevice:
    """The free budget across every model, and the pressure ``entry``'s governor reports."""

    def free_mb() -> float:
        return float(models.budget.budget_mb) - sum(models.resident().values())

    def pressure() -> str | None:
        governor = entry.governor
        return governor_pressure(governor) if governor is not None else None

    # The API calls the default model's server's taps for every model's answers.
    return ShadowDevice(free_mb=free_mb, pressure=pressure, taps=models.default_server.taps)


def attach(fleet: Any, models: Any) -> None:
    """Every updater ``fleet.make_updater`` makes from now on gets its model's ShadowDevice."""
    make_updater = fleet.make_updater

    def make_with_shadow(entry: Any) -> Any:
        updates = make_updater(entry)
        updates.target.shadow_device = device_for(models, entry)
        return updates

    setattr(fleet, "make_updater", make_with_shadow)  # noqa: B010 - an instance's method replaced
