"""The precision governor's state machine: one table, every transition in it.

The model's variants form a ladder, best precision first (fp32, fp16, int8, ...). The
governor keeps two numbers on it: the *ceiling* (the best rung allowed: 0 on mains power,
the rung of ``power.on_battery_max_precision`` on battery) and the *level* (the rung
serving now, never above the ceiling). Readings become events; the table says which
action each event causes in each state, and where the machine goes.

* Step down at ``thermal.step_down_c`` — before the hardware throttles at ``throttle_c`` —
  one rung per ``min_dwell_s``; at ``throttle_c`` (or when the firmware reports throttling)
  step down at once, dwell or not.
* Step back up only at ``step_up_c`` or below (hysteresis: the band between step_up_c and
  step_down_c causes nothing) and only after ``min_dwell_s`` since the last switch, so the
  governor cannot oscillate faster than the dwell time.
* The ladder only holds variants that passed their accuracy gate (the server loads no
  others), so every rung is a safe place to be.

An action that cannot run (dwell time not over, already at the floor) holds: the
transition is not taken and the state stays, so the state always tells the truth.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from edgesdk.agent.governor.sensors import SensorReading

from edgesdk.schemas.common import PRECISION_LADDER, Precision
from edgesdk.schemas.profile import Power, Thermal

log = logging.getLogger("edgesdk.agent.governor")


class State(str, Enum):
    STARTING = "STARTING"  # no model yet
    NOMINAL = "NOMINAL"  # at the ceiling, mains power
    STEPPED_DOWN = "STEPPED_DOWN"  # below the ceiling for heat, mains power
    POWER_SAVE = "POWER_SAVE"  # at the battery ceiling
    SAVE_STEPPED_DOWN = "SAVE_STEPPED_DOWN"  # below the battery ceiling for heat


class GovernorEvent(str, Enum):
    """What the state machine reacts to (not an event of the agent's event bus, ``schemas.messages.Event``)."""

    MODEL_CHANGED = "MODEL_CHANGED"  # a new ladder (bundle swap)
    TEMP_CRITICAL = "TEMP_CRITICAL"  # >= throttle_c, or the firmware is throttling
    TEMP_HIGH = "TEMP_HIGH"  # >= step_down_c
    TEMP_OK = "TEMP_OK"  # between step_up_c and step_down_c: hold
    TEMP_LOW = "TEMP_LOW"  # <= step_up_c
    ON_BATTERY = "ON_BATTERY"
    ON_AC = "ON_AC"
    AT_CEILING = "AT_CEILING"  # internal: a step up reached the ceiling


class Action(str, Enum):
    NONE = "NONE"
    RESET = "RESET"  # level = ceiling for the new ladder
    STEP_DOWN = "STEP_DOWN"  # one rung down, after the dwell time
    STEP_DOWN_NOW = "STEP_DOWN_NOW"  # one rung down, ignoring the dwell time
    STEP_UP = "STEP_UP"  # one rung up (not above the ceiling), after the dwell time
    CAP = "CAP"  # ceiling = battery ceiling; level follows it down at once
    UNCAP = "UNCAP"  # ceiling = top; level stays (steps up later, when cool)


S, E, A = State, GovernorEvent, Action

# fmt: off
#: (state, event) → (action, next state). A pair not listed is ignored.
TRANSITIONS: dict[tuple[State, GovernorEvent], tuple[Action, State]] = {
    (S.STARTING,          E.MODEL_CHANGED): (A.RESET,         S.NOMINAL),
    (S.NOMINAL,           E.MODEL_CHANGED): (A.RESET,         S.NOMINAL),
    (S.NOMINAL,           E.TEMP_HIGH):     (A.STEP_DOWN,     S.STEPPED_DOWN),
    (S.NOMINAL,           E.TEMP_CRITICAL): (A.STEP_DOWN_NOW, S.STEPPED_DOWN),
    (S.NOMINAL,           E.ON_BATTERY):    (A.CAP,           S.POWER_SAVE),
    (S.STEPPED_DOWN,      E.MODEL_CHANGED): (A.RESET,         S.NOMINAL),
    (S.STEPPED_DOWN,      E.TEMP_HIGH):     (A.STEP_DOWN,     S.STEPPED_DOWN),
    (S.STEPPED_DOWN,      E.TEMP_CRITICAL): (A.STEP_DOWN_NOW, S.STEPPED_DOWN),
    (S.STEPPED_DOWN,      E.TEMP_LOW):      (A.STEP_UP,       S.STEPPED_DOWN),
    (S.STEPPED_DOWN,      E.AT_CEILING):    (A.NONE,          S.NOMINAL),
    (S.STEPPED_DOWN,      E.ON_BATTERY):    (A.CAP,           S.SAVE_STEPPED_DOWN),
    (S.POWER_SAVE,        E.MODEL_CHANGED): (A.RESET,         S.POWER_SAVE),
    (S.POWER_SAVE,        E.TEMP_HIGH):     (A.STEP_DOWN,     S.SAVE_STEPPED_DOWN),
    (S.POWER_SAVE,        E.TEMP_CRITICAL): (A.STEP_DOWN_NOW, S.SAVE_STEPPED_DOWN),
    (S.POWER_SAVE,        E.ON_AC):         (A.UNCAP,         S.STEPPED_DOWN),
    (S.SAVE_STEPPED_DOWN, E.MODEL_CHANGED): (A.RESET,         S.POWER_SAVE),
    (S.SAVE_STEPPED_DOWN, E.TEMP_HIGH):     (A.STEP_DOWN,     S.SAVE_STEPPED_DOWN),
    (S.SAVE_STEPPED_DOWN, E.TEMP_CRITICAL): (A.STEP_DOWN_NOW, S.SAVE_STEPPED_DOWN),
    (S.SAVE_STEPPED_DOWN, E.TEMP_LOW):      (A.STEP_UP,       S.SAVE_STEPPED_DOWN),
    (S.SAVE_STEPPED_DOWN, E.AT_CEILING):    (A.NONE,          S.POWER_SAVE),
    (S.SAVE_STEPPED_DOWN, E.ON_AC):         (A.UNCAP,         S.STEPPED_DOWN),
}
# fmt: on

_STEPPED = (State.STEPPED_DOWN, State.SAVE_STEPPED_DOWN)
_ON_BATTERY_STATES = (State.POWER_SAVE, State.SAVE_STEPPED_DOWN)


@dataclass(frozen=True)
class Rung:
    """One variant on the ladder."""

    variant_id: str
    precision: Precision


@dataclass(frozen=True)
class Switch:
    """A decision: serve ``to`` instead of ``frm``, because ``reason``."""

    frm: str
    to: str
    reason: str


class PrecisionStateMachine:
    """Turns readings into switches. Pure: no threads, no I/O; the clock is injectable."""

    def __init__(
        self,
        thermal: Thermal,
        power: Power,
        *,
        min_dwell_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.thermal = thermal
        self.power = power
        self.min_dwell_s = thermal.min_dwell_s if min_dwell_s is None else min_dwell_s
        self.clock = clock
        self.state = State.STARTING
        self.ladder: list[Rung] = []
        self.level = 0
        self.ceiling = 0
        self.last_switch_at = float("-inf")
        self.held: dict[str, int] = {"dwell": 0, "floor": 0}
        self.transitions = 0

    # -- inputs -----------------------------------------------------------------------------------

    def model_changed(self, ladder: Sequence[Rung], on_battery: bool = False) -> Switch | None:
        """A new model: start at the ceiling (the machine keeps its power state)."""
        old = self.ladder[self.level].variant_id if self.ladder else None
        self.ladder = list(ladder)
        self.level = 0
        self.last_switch_at = float("-inf")  # a fresh model may step down at once if hot
        self._fire(GovernorEvent.MODEL_CHANGED, "new model")
        new = self.current
        return Switch(old, new, "new model") if old and new and old != new else None

    def events_for(self, reading: SensorReading) -> list[GovernorEvent]:
        """Level-triggered events of a reading: power first, then temperature."""
        events: list[GovernorEvent] = []
        on_battery = reading.power_source == "battery"
        if on_battery and self.state not in _ON_BATTERY_STATES:
            events.append(GovernorEvent.ON_BATTERY)
        elif not on_battery and self.state in _ON_BATTERY_STATES:
            events.append(GovernorEvent.ON_AC)
        hottest = reading.hottest_c
        if reading.firmware_throttling or (hottest is not None and hottest >= self.thermal.throttle_c):
            events.append(GovernorEvent.TEMP_CRITICAL)
        elif hottest is not None and hottest >= self.thermal.step_down_c:
            events.append(GovernorEvent.TEMP_HIGH)
        elif hottest is not None and hottest <= self.thermal.step_up_c:
            events.append(GovernorEvent.TEMP_LOW)
        elif hottest is not None:
            events.append(GovernorEvent.TEMP_OK)
        return events

    def update(self, reading: SensorReading) -> Switch | None:
        """Feed one reading; returns the switch to make, if the level moved."""
        if not self.ladder:
            return None
        before = self.level
        reasons = []
        for event in self.events_for(reading):
            reason = self._reason(event, reading)
            if self._fire(event, reason) and self.level != before:
                reasons.append(reason)
        if self.level == before:
            return None
        return Switch(self.ladder[before].variant_id, self.ladder[self.level].variant_id, "; ".join(reasons))

    # -- the machine --------------------------------------------------------------------------------

    @property
    def current(self) -> str | None:
        return self.ladder[self.level].variant_id if self.ladder else None

    def _reason(self, event: GovernorEvent, reading: SensorReading) -> str:
        hottest = reading.hottest_c
        t = self.thermal
        if event == GovernorEvent.TEMP_CRITICAL:
            if reading.firmware_throttling:
                return f"firmware reports throttling ({', '.join(k for k, v in reading.throttled.items() if v and not k.endswith('_occurred'))})"
            return f"temperature {hottest:.1f} °C >= throttle point {t.throttle_c:g} °C"
        if event == GovernorEvent.TEMP_HIGH:
            return f"temperature {hottest:.1f} °C >= step-down point {t.step_down_c:g} °C"
        if event == GovernorEvent.TEMP_LOW:
            return f"temperature {hottest:.1f} °C <= step-up point {t.step_up_c:g} °C"
        if event == GovernorEvent.ON_BATTERY:
            cap = self.power.on_battery_max_precision
            return f"on battery (max precision {cap.value if cap else 'unrestricted'})"
        if event == GovernorEvent.ON_AC:
            return "back on mains power"
        return event.value.lower()

    def _fire(self, event: GovernorEvent, reason: str) -> bool:
        """Apply one event; True when the transition was taken."""
        row = TRANSITIONS.get((self.state, event))
        if row is None:
            return False
        action, next_state = row
        if not self._apply(action):
            return False
        if next_state != self.state:
            log.debug("governor %s --%s/%s--> %s", self.state.value, event.value, action.value, next_state.value)
        self.state = next_state
        self.transitions += 1
        if self.state in _STEPPED and self.level <= self.ceiling:
            self._fire(GovernorEvent.AT_CEILING, reason)
        return True

    def _dwell_over(self) -> bool:
        if self.clock() - self.last_switch_at >= self.min_dwell_s:
            return True
        self.held["dwell"] += 1
        return False

    def _apply(self, action: Action) -> bool:
        floor = len(self.ladder) - 1
        if action == Action.NONE:
            return True
        if action == Action.RESET:
            self.ceiling = self._battery_ceiling() if self.state in _ON_BATTERY_STATES else 0
            self.level = self.ceiling
            return True
        if action in (Action.STEP_DOWN, Action.STEP_DOWN_NOW):
            if self.level >= floor:
                self.held["floor"] += 1
                return False
            if action == Action.STEP_DOWN and not self._dwell_over():
                return False
            self._move(self.level + 1)
            return True
        if action == Action.STEP_UP:
            if self.level <= self.ceiling or not self._dwell_over():
                return False
            self._move(self.level - 1)
            return True
        if action == Action.CAP:
            self.ceiling = self._battery_ceiling()
            if self.level < self.ceiling:
                self._move(self.ceiling)  # the power policy is not a thermal step: no dwell
            return True
        if action == Action.UNCAP:
            self.ceiling = 0
            return True
        raise ValueError(f"unknown action {action}")  # pragma: no cover - the enum is closed

    def _move(self, level: int) -> None:
        self.level = level
        self.last_switch_at = self.clock()

    def _battery_ceiling(self) -> int:
        cap = self.power.on_battery_max_precision
        if cap is None or not self.ladder:
            return 0
        limit = PRECISION_LADDER.index(cap)
        for index, rung in enumerate(self.ladder):
            if PRECISION_LADDER.index(rung.precision) >= limit:
                return index
        return len(self.ladder) - 1  # nothing as low as the cap: the lowest there is
