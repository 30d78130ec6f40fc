"""The governor thread: poll the sensors, feed the state machine, apply its switches."""

from __future__ import annotations

import logging
import threading
from typing import Any

from edgesdk.agent.events import EventBus
from edgesdk.agent.governor.machine import PrecisionStateMachine, Rung, Switch
from edgesdk.agent.governor.sensors import SensorReading, SensorSource
from edgesdk.agent.serving import ModelServer

from edgesdk.schemas.profile import DeviceProfile

log = logging.getLogger("edgesdk.agent.governor")


class Governor:
    """Owns the machine and the polling thread; switches go through ``server.switch_variant``."""

    def __init__(
        self,
        server: ModelServer,
        source: SensorSource,
        profile: DeviceProfile,
        *,
        events: EventBus,
        poll_interval_s: float = 1.0,
        min_dwell_s: float | None = None,
        enabled: bool = True,
    ) -> None:
        self.server = server
        self.source = source
        self.events = events
        self.poll_interval_s = poll_interval_s
        self.enabled = enabled
        self.machine = PrecisionStateMachine(profile.thermal, profile.power, min_dwell_s=min_dwell_s)
        self.last_reading = SensorReading()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        events.subscribe(self._on_event)

    @property
    def state(self) -> str:
        return self.machine.state.value if self.enabled else "DISABLED"

    def _on_event(self, name: str, detail: dict[str, Any]) -> None:
        if name != "model_loaded":
            return
        model = self.server.model
        if model is None or detail.get("model", model.name) != model.name:
            return  # another model of the device loaded (each model has its own governor)
        with self._lock:
            switch = self.machine.model_changed([Rung(v.id, v.precision) for v in model.ladder])
            target = self.machine.current
        if target and model.active.id != target:
            self._apply(Switch(model.active.id, target, switch.reason if switch else "governor ceiling"))

    def tick(self) -> Switch | None:
        """One poll: read, decide, switch. Returns the switch made (tests call this directly)."""
        try:
            reading = self.source.read()
        except Exception as exc:  # noqa: BLE001 - sensors must never stop inference
            log.warning("sensor read failed: %s", exc)
            return None
        self.last_reading = reading
        if not self.enabled:
            return None
        with self._lock:
            switch = self.machine.update(reading)
        if switch is not None:
            self._apply(switch)
        return switch

    def _apply(self, switch: Switch) -> None:
        try:
            self.server.switch_variant(switch.to, switch.reason)
        except Exception:  # noqa: BLE001 - a failed switch leaves the old variant serving
            log.exception("precision switch to %s failed", switch.to)

    def status(self) -> dict[str, Any]:
        m = self.machine
        return {
            "enabled": self.enabled,
            "state": self.state,
            "ladder": [r.variant_id for r in m.ladder],
            "level": m.level,
            "ceiling": m.ceiling,
            "min_dwell_s": m.min_dwell_s,
            "held": dict(m.held),
            "thermal": {
                "step_up_c": m.thermal.step_up_c,
                "step_down_c": m.thermal.step_down_c,
                "throttle_c": m.thermal.throttle_c,
            },
            "sensors": self.last_reading.as_dict(),
        }

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="governor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.poll_interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
