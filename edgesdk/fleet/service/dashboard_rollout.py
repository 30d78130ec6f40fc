"""Parts of the dashboard's rollout page: a progress bar per wave, the probation countdown of
the devices in probation, each probation device's latest shadow agreement, and why the canary has the size it has (``plan_waves`` rounds a share
of the devices up: 34 % of 3 devices is 1.02, so 2 devices)."""

from __future__ import annotations

import math
import time
from typing import Any

from edgesdk.fleet.service.dashboard_ui import escape
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.quality import probation_agreement

_DONE = {"COMMITTED"}
_FAILED = {"FAILED", "ROLLED_BACK", "TIMED_OUT"}


def wave_progress(members: list[Any], probation_s: float, now: float | None = None) -> str:
    """One line over a wave's table: a bar of the devices done, the failed ones, the countdown."""
    now = time.time() if now is None else now
    done = sum(1 for d in members if d.state in _DONE)
    failed = sum(1 for d in members if d.state in _FAILED)
    text = f"{done} of {len(members)} committed" + (f" · {failed} failed" if failed else "")
    ends = [d.updated + probation_s for d in members if d.state == "PROBATION" and d.updated is not None]
    if ends:
        end = max(ends)
        left = max(0.0, end - now)
        text += (
            f" · probation ends in <b class=countdown>{left:.0f} s</b> "
            f"({time.strftime('%H:%M:%S', time.localtime(end))})"
        )
    return (
        f'<p class=wave-progress><progress max="{len(members)}" value="{done}">{done}/{len(members)}</progress> '
        f"{text}</p>"
    )


def canary_note(plan: dict[str, Any], devices: int) -> str:
    """Why the canary has its size, when the share of the devices is not a whole number."""
    share = float(plan.get("canary", 0) or 0)
    if share <= 0 or devices < 2:
        return ""
    exact = share * devices
    picked = max(1, math.ceil(exact))
    if math.isclose(exact, picked):
        return ""
    return (
        f"<p class=idle id=canary-note>canary {share:.0%} of {devices} devices is {exact:.2f}, "
        f"rounded up to {picked} device{'s' if picked != 1 else ''} (a canary is at least one whole device)</p>"
    )


def agreement_notes(engine: Any, devices: list[Any], model: str) -> dict[str, str]:
    """Per device in probation whose newest report of ``model`` carries shadow agreement, a line
    for its row: the worst output's figure, its lower bound against the minimum, the samples."""
    probation = [d.device_id for d in devices if d.state == "PROBATION"]
    if not probation:
        return {}
    with Transaction(engine) as db:
        found = probation_agreement(db, probation, model)
    return {device_id: _agreement_note(figures) for device_id, figures in found.items()}


def _agreement_note(figures: dict[str, dict[str, Any]]) -> str:
    output, worst = min(figures.items(), key=lambda item: item[1]["lower_bound"])
    minimum = worst.get("minimum")
    judged = "" if minimum is None else (" ≥ " if worst["lower_bound"] >= minimum else " < ") + f"{minimum:g}"
    css = "bad" if minimum is not None and worst["lower_bound"] < minimum else "idle"
    return (
        f'<span class="agreement {css}">shadow agreement {worst["value"]:.3f} on {escape(output)} '
        f"({escape(worst['kind'])}), lower bound {worst['lower_bound']:.3f}{judged} over {worst['samples']} requests</span>"
    )
