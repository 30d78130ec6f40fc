"""The ``/v1/status`` document: identity, the default model, every model, the memory budget,
the governor and sensors, each model's store and updater, problems and recent events.

It only reads: :class:`AgentStatus` is handed the parts it reports on by the daemon
(``agent/daemon.py``), and the list of start problems it shares with them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.profiling import load_saved

from edgesdk._version import __version__
from edgesdk.schemas.agent_config import AgentConfig
from edgesdk.schemas.profile import DeviceProfile

if TYPE_CHECKING:
    from edgesdk.agent.device_models import DeviceModels, ModelParts
    from edgesdk.agent.events import EventBus
    from edgesdk.agent.governor.runner import Governor
    from edgesdk.agent.install_profiling import InstallProfiler
    from edgesdk.agent.security_state import SecurityState
    from edgesdk.agent.serving import ModelServer
    from edgesdk.agent.trust import AgentTrust


class AgentStatus:
    """Builds the status document from the parts it is given (``linked`` says whether an MQTT
    link was made: it is made after this object)."""

    def __init__(
        self,
        config: AgentConfig,
        profile: DeviceProfile,
        *,
        server: ModelServer,
        governor: Governor,
        models: DeviceModels,
        events: EventBus,
        problems: list[str],
        trust: AgentTrust | None,
        security: SecurityState,
        profiler: InstallProfiler,
        data_dir: Path,
        linked: Callable[[], bool],
    ) -> None:
        self.config, self.profile = config, profile
        self.server, self.governor, self.models, self.events = server, governor, models, events
        self.problems, self.trust, self.security = problems, trust, security
        self.profiler, self.data_dir, self.linked = profiler, data_dir, linked
        self.started_at = time.time()

    def document(self) -> dict[str, Any]:
        """What /v1/status shows."""
        default = self.models.default_entry()
        reading = self.governor.last_reading
        return {
            "device_id": self.config.device_id,
            "profile": self.profile.name,
            "agent_version": __version__,
            "uptime_s": round(time.time() - self.started_at, 1),
            "model": _status_model(self.server.running_model()),
            "variants": self.server.describe_variant_choices(),
            "governor": self.governor.status(),
            "temperatures_c": dict(reading.temperatures_c),
            "power_source": reading.power_source,
            "switch_count": self.server.switch_count,
            "store": _status_store(default) if default is not None else None,
            "models": [self._status_entry(entry) for entry in self.models.entries()],
            "memory": self.models.memory(),
            "problems": list(self.problems),
            "recent_events": [
                {"ts": round(ts, 3), "event": name, **detail} for ts, name, detail in list(self.events.recent)[-20:]
            ],
            "link": self.linked(),
            "updates": default.updates.status() if default is not None and default.updates is not None else None,
            "trust": self.trust.status() if self.trust is not None else None,
            "security_state": self.security.status(),
            "measured": load_saved(self.data_dir),  # edge-agent profile's figures, if it ran
            "profiling": self.profiler.status(),  # profiling at install: running, done, failed (why)
        }

    def _status_entry(self, entry: ModelParts) -> dict[str, Any]:
        governor = entry.governor
        resident = entry.resident_mb()
        return {
            "name": entry.name,
            "default": entry.name == self.models.default_name,
            "running": _status_model(entry.server.running_model()),
            "resident_mb": round(resident, 2) if resident is not None else None,
            "pinned_precision": entry.pinned.value if entry.pinned is not None else None,
            "governor": governor.state if governor is not None else None,
            "store": _status_store(entry),
            "updates": entry.updates.status() if entry.updates is not None else None,
        }


def _status_model(running: Any) -> dict[str, Any] | None:
    if running is None:
        return None
    # "model" (the name) is the key /v1/status has always had; clients read it
    # (examples/device/client.py), so it stays beside RunningModel's own "name".
    return {"model": running.name, **running.model_dump(mode="json")}


def _status_store(entry: ModelParts) -> dict[str, Any]:
    store = entry.store
    return {
        "active_slot": store.active_slot,
        "previous_slot": store.previous_slot,
        "committed": store.committed,
        "last_load": store.load_report,
    }
