"""Several models on one device: each its own store, server, governor, statistics and updater.

:class:`DeviceModels` holds one :class:`ModelParts` per installed model name. The *default* model's
entry uses the agent's own ``ModelServer`` (``Agent.server``), the one the local API is given:
a request naming another model is handed by that server to the other model's server
(``ModelServer.others``), so ``/v1/models/{name}/infer`` and ``/v2/models/{name}/infer`` route
by name while the single-model routes and reports (``/readyz``, ``/v1/status``'s ``model``, a
deployment naming no model) keep meaning the default model.

Isolation: an entry's server swaps only its own model, its store is its own directory
(:mod:`edgesdk.agent.installed_models`), and its updater its own state machine; what one model does
(an update, a rollback, a store that fails to verify) never replaces or blocks the reference
another model's requests hold.

Memory: :meth:`DeviceModels.admit` is the budget check every install path runs after the bundle
verified and before anything is staged (:mod:`edgesdk.agent.memory_budget`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.installed_models import InstalledModels, ModelSlotStore, check_model_name
from edgesdk.agent.memory_budget import ModelRamBudget, served_load_mb
from edgesdk.agent.metrics import InferenceStats
from edgesdk.agent.serving import ModelServer

from edgesdk.errors import AgentError
from edgesdk.schemas.common import Precision
from edgesdk.schemas.messages import RunningModel

if TYPE_CHECKING:
    from edgesdk.agent.events import EventBus
    from edgesdk.agent.governor.runner import Governor

log = logging.getLogger("edgesdk.agent.device_models")


@dataclass
class ModelParts:
    """One model's running parts: its server, statistics, slot store, governor and updater."""

    name: str
    server: ModelServer
    stats: InferenceStats
    store: ModelSlotStore
    governor: Governor | None = None
    #: The model's UpdateManager, once the updater started (None without the OTA module).
    updates: Any = None
    #: Pinned precision (``[models.NAME] precision``): its governor never switches it.
    pinned: Precision | None = None
    #: (slot, bundle sha256) whose file was re-hashed after load (see Agent.load_installed).
    bundle_checked: tuple[Any, str] | None = None

    @property
    def model_dir(self) -> Path:
        return self.store.data_dir

    def resident_mb(self) -> float | None:
        """What the model holds in memory: its loaded variants' load sizes; where this process
        does not serve it (``edge-agent install`` beside the daemon), its active slot's."""
        model = self.server.model
        return served_load_mb(model) if model is not None else self.store.active_load_mb()

    def running_model(self) -> RunningModel | None:
        return self.server.running_model()


#: Builds the parts of a new entry: (name, store) → the entry (the daemon's factory).
ModelPartsFactory = Callable[[str, ModelSlotStore], ModelParts]


class DeviceModels:
    """The models this agent runs, by name, the default one first: each one's :class:`ModelParts`."""

    def __init__(
        self,
        stores: InstalledModels,
        default_server: ModelServer,
        default_stats: InferenceStats,
        *,
        make_entry: ModelPartsFactory,
        budget: ModelRamBudget,
        events: EventBus,
        default_name: str | None = None,
        default_governor: Governor | None = None,
        pins: dict[str, Precision] | None = None,
    ) -> None:
        self.stores = stores
        self.default_server = default_server
        self.default_stats = default_stats
        self.default_governor = default_governor
        self.budget = budget
        self.pins = dict(pins or {})
        self._make_entry = make_entry
        self._entries: dict[str, ModelParts] = {}
        self._lock = threading.Lock()
        #: Updates of different models run one after another (docs/ota.md, "Several models").
        self.update_turn = threading.Lock()
        if default_name is not None:
            stores.set_default(default_name)
        events.subscribe(self._on_event)

    # -- entries ----------------------------------------------------------------------------------

    @property
    def default_name(self) -> str | None:
        return self.stores.default

    def names(self) -> list[str]:
        """Installed models (with a store) and the ones opened at this start, default first."""
        names = set(self.stores.names()) | set(self._entries)
        default = self.default_name
        return sorted(names, key=lambda n: (n != default, n))

    def entries(self) -> list[ModelParts]:
        return [self.entry(name) for name in self.names()]

    def known(self, name: str) -> bool:
        return name in self._entries or name in self.stores.names()

    def entry(self, name: str) -> ModelParts:
        """The entry of ``name``, made on first use; the first model of a device becomes its default."""
        found = self._entries.get(name)
        if found is not None:
            return found
        check_model_name(name)
        with self._lock:
            found = self._entries.get(name)
            if found is not None:
                return found
            if self.default_name is None:
                self.stores.set_default(name)
            store = self.stores.store(name)
            if name == self.default_name:
                entry = ModelParts(name, self.default_server, self.default_stats, store, self.default_governor)
            else:
                entry = self._make_entry(name, store)
            entry.pinned = self.pins.get(name)
            if entry.pinned is not None and entry.governor is not None:
                entry.governor.enabled = False  # the pin decides (a first model named only now)
            self._entries[name] = entry
            self._publish_routes()
            return entry

    def default_entry(self) -> ModelParts | None:
        name = self.default_name
        return self.entry(name) if name is not None else None

    def _publish_routes(self) -> None:
        """The default server's view of the others (one reference assignment: requests read it once)."""
        default = self.default_name
        self.default_server.others = {n: e.server for n, e in self._entries.items() if n != default}

    # -- reports ----------------------------------------------------------------------------------

    def running_models(self) -> list[RunningModel]:
        """Every model serving now, default first (presence, telemetry)."""
        return [running for e in self.entries() if (running := e.running_model()) is not None]

    def resident(self, *, besides: str | None = None) -> dict[str, float]:
        """Resident load size (MB) of each serving model, ``besides`` left out."""
        return {e.name: mb for e in self.entries() if e.name != besides and (mb := e.resident_mb()) is not None}

    def memory(self) -> dict[str, Any]:
        """The budget and what the serving models hold (``/v1/status``, telemetry)."""
        resident = self.resident()
        used = round(sum(resident.values()), 2)
        return {
            "model_budget_mb": self.budget.budget_mb,
            "resident_mb": used,
            "free_mb": round(self.budget.budget_mb - used, 2),
            "models": {name: round(mb, 2) for name, mb in sorted(resident.items())},
        }

    # -- installs -----------------------------------------------------------------------------------

    def admit(self, name: str, manifest: Any) -> None:
        """Refuse (ModelRamBudgetError, with the figures) a bundle of model ``name`` that would not fit
        beside what the other models hold; AgentError when the bundle is another model's."""
        if manifest.model.name != name:
            raise AgentError(
                f"bundle is model {manifest.model.name!r}, not {name!r}: each model installs into its own store"
            )
        self.budget.check(manifest, self.resident(besides=name))

    # -- per-model policy -----------------------------------------------------------------------------

    def _on_event(self, name: str, detail: dict[str, Any]) -> None:
        if name != "model_loaded":
            return
        model_name = detail.get("model")
        pinned = self.pins.get(model_name) if isinstance(model_name, str) else None
        entry = self._entries.get(model_name) if isinstance(model_name, str) else None
        if pinned is None or entry is None:
            return
        model = entry.server.model
        if model is None or model.name != model_name:
            return
        variant = next((v for v in model.ladder if v.precision is pinned), None)
        if variant is None:
            log.warning("model %s is pinned to %s but no %s variant loaded", model_name, pinned.value, pinned.value)
            return
        entry.server.switch_variant(variant.id, f"pinned to {pinned.value} by [models.{model_name}]")
