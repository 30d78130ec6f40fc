"""Scripted sensor traces (the governor's ``trace`` source) for the demo's agents.

The hot device replays heat waves: cool, then above the profile's ``step_down_c`` (but below
``throttle_c``) long enough to step down the whole ladder, then below ``step_up_c`` long
enough to climb back. Waves repeat for the length of a demo, so whenever the model arrives
the next wave shows the governor at work. The other devices idle at a steady temperature
with a little wander, so their temperature plots are not flat lines.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from edgesdk.schemas.profile import Thermal

#: One heat wave: seconds cool, seconds hot, seconds cooling down.
WAVE_S = (8.0, 12.0, 12.0)
TRACE_LENGTH_S = 900.0
STEP_S = 1.0


def write_heat_trace(path: Path, thermal: Thermal, *, sensor: str = "soc") -> Path:
    """Repeating heat waves for ``thermal`` (the device profile's thermal points)."""
    cool = thermal.step_up_c - 12.0
    hot = (thermal.step_down_c + thermal.throttle_c) / 2.0  # step down, but do not throttle
    cooling = thermal.step_up_c - 6.0
    period = sum(WAVE_S)
    lines = []
    at = 0.0
    while at < TRACE_LENGTH_S:
        phase = at % period
        if phase < WAVE_S[0]:
            temp = cool
        elif phase < WAVE_S[0] + WAVE_S[1]:
            temp = hot
        else:
            temp = cooling
        lines.append(json.dumps({"at_s": at, "temperatures_c": {sensor: round(temp, 1)}, "power_source": "ac"}))
        at += STEP_S
    lines.append(json.dumps({"at_s": at, "temperatures_c": {sensor: cool}, "power_source": "ac"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_idle_trace(path: Path, thermal: Thermal, *, seed: int, sensor: str = "soc") -> Path:
    """A steady temperature well below ``step_up_c``, wandering by a degree or two."""
    base = thermal.step_up_c - 15.0 + seed
    lines = [
        json.dumps(
            {
                "at_s": at,
                "temperatures_c": {sensor: round(base + 1.5 * math.sin(at / 9.0 + seed), 1)},
                "power_source": "ac",
            }
        )
        for at in range(0, int(TRACE_LENGTH_S), int(STEP_S))
    ]
    path.write_text("\n".join(lines) + "\n")
    return path
