"""Whether the device is under thermal or power pressure, as its governor sees it: the shadow
worker then runs nothing (its reference runs are the first work to shed)."""

from __future__ import annotations

from typing import Any


def governor_pressure(governor: Any) -> str | None:
    """Why the device is under pressure now (firmware throttling, at or above the governor's
    ``step_down_c``, stepped down for heat, on battery), or None. Reads the governor's last
    sensor reading (taken every poll, even with switching disabled) and its machine's state."""
    reading = governor.last_reading
    if reading.firmware_throttling:
        return "the firmware is throttling"
    if reading.power_source == "battery":
        return "on battery"
    hottest = reading.hottest_c
    step_down = governor.machine.thermal.step_down_c
    if hottest is not None and hottest >= step_down:
        return f"{hottest:.0f} °C ≥ step_down_c {step_down:g}"
    state = getattr(governor.machine.state, "value", governor.machine.state)
    if state in ("STEPPED_DOWN", "SAVE_STEPPED_DOWN"):
        return f"governor {state}"
    return None
