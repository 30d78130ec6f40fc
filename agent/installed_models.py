"""One A/B store per installed model, and the migration of a single-model data dir.

Layout under the agent's data dir::

    models/index.json          the default model, and every model that ever committed
    models/digits/             one SlotStore (slots/, store.json, rollback_floor) ...
    models/digits/ota/         ... and its own update record (state.json, downloads)
    models/wakeword/           another model: its own slots, floor, probation and rollback
    ota/command_sequence.json  the operator's command sequence stays one per device

Each model's store is the single-model :class:`~edgesdk.agent.slot_store.SlotStore` rooted in its
own directory, so installing, updating, rolling back or losing the store of one model touches
no file of another.

Anti-rollback stays fail-closed per model: a model's floor lives in its directory, and
``index.json`` remembers every model that committed. A model the index knows whose floor records
are gone (its directory deleted or rotted) raises
:class:`~edgesdk.errors.RollbackFloorUnknownError`, so installs of it are refused rather than
accepted as if the device had never had it. (Losing both the index and the directory is losing
every record, the same limit as for the single store; see docs/trust.md.)

Migration: a data dir written by a single-model agent (``slots/``, ``store.json`` and
``rollback_floor`` at its top) is moved into ``models/<name>/`` at start, the name read from
``store.json`` (or the staged bundle's manifest). Every step is a rename on one filesystem into
``models/.migrating-<name>/``, which is renamed into place last; a start that dies half way
finds the staging directory and finishes the move. The migrated model becomes the default one,
which the single-model routes keep serving.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.fsutil import atomic_write_json, fsync_dir
from edgesdk.agent.rollback_floor import FLOOR_FILE
from edgesdk.agent.slot_store import BUNDLE_FILE, SLOTS, SlotStore

from edgesdk.errors import AgentError, RollbackFloorUnknownError

if TYPE_CHECKING:
    from edgesdk.agent.security_state import SecurityState

log = logging.getLogger("edgesdk.agent.installed_models")

MODELS_DIR = "models"
INDEX_FILE = "index.json"
#: What a single-model agent kept at the top of its data dir, moved into the model's directory.
LEGACY_STORE_ITEMS = ("slots", "store.json", FLOOR_FILE)
#: The update record of that model (its deployment, its downloads); the sequence ledger stays.
_LEGACY_OTA_FILE = re.compile(r"^(state\.json|.+\.edgepkg|.+\.part)$")
_STAGING_PREFIX = ".migrating-"
#: A manifest's model name (edgesdk.schemas.manifest) is already this; checked again for a path.
MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def check_model_name(name: str) -> str:
    """``name`` when it can name a model directory; AgentError (one line) otherwise."""
    if not MODEL_NAME.match(name) or ".." in name:
        raise AgentError(f"model name {name!r} is not valid (lowercase letters, digits, '.', '_', '-'; 64 at most)")
    return name


class ModelIndexFile:
    """``models/index.json``: the default model and the models that committed (atomic writes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data = self._read()

    def _read(self) -> dict[str, Any]:
        empty: dict[str, Any] = {"default": None, "committed": []}
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return empty
        except (OSError, ValueError) as exc:
            log.error("model index %s unreadable (%s); rebuilt from the model directories", self.path, exc)
            return empty
        if not isinstance(data, dict) or not isinstance(data.get("committed", []), list):
            log.error("model index %s malformed; rebuilt from the model directories", self.path)
            return empty
        return {**empty, **data}

    @property
    def default(self) -> str | None:
        value = self._data.get("default")
        return value if isinstance(value, str) else None

    def committed(self, name: str) -> bool:
        return name in self._data["committed"]

    def update(self, *, default: str | None = None, committed: str | None = None) -> None:
        changed = False
        if default is not None and self._data.get("default") != default:
            self._data["default"] = default
            changed = True
        if committed is not None and committed not in self._data["committed"]:
            self._data["committed"] = sorted([*self._data["committed"], committed])
            changed = True
        if changed:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write_json(self.path, self._data)


class ModelSlotStore(SlotStore):
    """The A/B store of one model; its commits are remembered in the device's model index."""

    def __init__(self, model_dir: Path, name: str, index: ModelIndexFile, **kwargs: Any) -> None:
        super().__init__(model_dir, **kwargs)
        self.name = name
        self._index = index

    def stage(self, verified: Any) -> Any:
        """Stage as the single store does, and record the bundle's load size with the slot."""
        from edgesdk.agent.memory_budget import bundle_load_mb

        slot = super().stage(verified)
        with self._locked():
            if slot in self._state["slots"]:
                self._state["slots"][slot]["load_mb"] = round(bundle_load_mb(verified.manifest), 3)
                self._save()
        return slot

    def active_load_mb(self) -> float | None:
        """The load size recorded when the active slot was staged (None: empty, or staged before)."""
        info = self.slot_info(self.active_slot) if self.active_slot else None
        value = (info or {}).get("load_mb")
        return float(value) if isinstance(value, (int, float)) else None

    def commit(self) -> None:
        super().commit()
        self._index.update(committed=self.name)

    def rollback_floor(self) -> int | None:
        floor = super().rollback_floor()
        if floor is None and self._index.committed(self.name):
            raise RollbackFloorUnknownError(
                f"rollback floor cannot be established for model {self.name!r}: {self._index.path} says it committed "
                f"before, but no record of its release survives in {self.data_dir}; installs of {self.name!r} are "
                "refused until the device is re-provisioned"
            )
        return floor


class InstalledModels:
    """The device's installed models by name: each one's slot store under ``data_dir/models``; created on
    first use, migrated at start."""

    def __init__(self, data_dir: Path, *, security: SecurityState | None = None, **store_options: Any) -> None:
        self.data_dir = Path(data_dir)
        #: The device's security state: each model's floor is also kept there (fails closed as a whole).
        self.security = security
        self.root = self.data_dir / MODELS_DIR
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.index = ModelIndexFile(self.root / INDEX_FILE)
        self._options = store_options
        self._stores: dict[str, ModelSlotStore] = {}
        #: The model a single-model data dir was migrated to at this start, if any.
        self.migrated: str | None = migrate_single_model(self.data_dir, self.index)

    def model_dir(self, name: str) -> Path:
        return self.root / check_model_name(name)

    def names(self) -> list[str]:
        """The models with a store here (installed, or being installed), sorted."""
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and MODEL_NAME.match(p.name) and _holds_store(p)
        )

    def store(self, name: str) -> ModelSlotStore:
        """The store of ``name`` (created empty on first use)."""
        found = self._stores.get(name)
        if found is None:
            recorded = self.security.release_floor(name) if self.security is not None else None
            found = ModelSlotStore(self.model_dir(name), name, self.index, recorded_floor=recorded, **self._options)
            self._stores[name] = found
        return found

    @property
    def default(self) -> str | None:
        """The model the single-model routes serve: the index's, else the only one installed."""
        named = self.index.default
        if named is not None:
            return named
        names = self.names()
        return names[0] if len(names) == 1 else None

    def set_default(self, name: str) -> None:
        self.index.update(default=check_model_name(name))


def _holds_store(model_dir: Path) -> bool:
    return (model_dir / "store.json").exists() or any((model_dir / "slots" / s / BUNDLE_FILE).exists() for s in SLOTS)


def _legacy_name(data_dir: Path) -> str:
    """The model a single-model data dir holds: from store.json, else a staged bundle's manifest."""
    try:
        state = json.loads((data_dir / "store.json").read_text())
        slots = state.get("slots", {})
        for slot in (state.get("active"), *SLOTS):
            name = (slots.get(slot) or {}).get("name") if slot else None
            if isinstance(name, str) and MODEL_NAME.match(name):
                return name
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    from edgesdk.bundle import inspect_bundle  # only when store.json cannot say

    for slot in SLOTS:
        path = data_dir / "slots" / slot / BUNDLE_FILE
        if path.is_file():
            try:
                name = inspect_bundle(path).manifest.model.name
            except Exception as exc:  # noqa: BLE001 - a rotted bundle names nothing; the next one may
                log.warning("slot %s: cannot read the model name of %s: %s", slot, path, exc)
                continue
            if MODEL_NAME.match(name):
                return name
    # Nothing names it (no state, no readable bundle), yet a store was there: keep its floor
    # records under a name of their own rather than drop them.
    return "legacy"


def migrate_single_model(data_dir: Path, index: ModelIndexFile) -> str | None:
    """Move a single-model store into ``models/<name>/``; returns the name, None when nothing to move."""
    root = data_dir / MODELS_DIR
    pending = sorted(root.glob(f"{_STAGING_PREFIX}*")) if root.exists() else []
    legacy = [item for item in LEGACY_STORE_ITEMS if (data_dir / item).exists()]
    if not legacy and not pending:
        return None
    name = pending[0].name[len(_STAGING_PREFIX) :] if pending else _legacy_name(data_dir)
    target = root / name
    if target.exists():
        raise AgentError(
            f"cannot migrate the single-model store of {name!r} into {target}: that directory exists already; "
            f"move one of them away (the store at the top of {data_dir} is untouched)"
        )
    staging = root / f"{_STAGING_PREFIX}{name}"
    (staging / "ota").mkdir(parents=True, exist_ok=True, mode=0o700)
    committed = _legacy_committed(data_dir / "store.json") or _legacy_committed(staging / "store.json")
    # The index learns the model (and that it committed) first: a crash from here on still
    # leaves the floor fail-closed for it.
    index.update(default=index.default or name, committed=name if committed else None)
    for item in legacy:
        os.replace(data_dir / item, staging / item)
    ota = data_dir / "ota"
    if ota.is_dir():
        for path in ota.iterdir():
            if _LEGACY_OTA_FILE.match(path.name):
                os.replace(path, staging / "ota" / path.name)
        fsync_dir(ota)
    (data_dir / "store.lock").unlink(missing_ok=True)  # each model's store has its own
    fsync_dir(staging / "ota")
    fsync_dir(staging)
    fsync_dir(data_dir)
    os.replace(staging, target)
    fsync_dir(root)
    log.warning("migrated the single-model store of %r into %s (now the default model)", name, target)
    return name


def _legacy_committed(state_path: Path) -> bool:
    try:
        state = json.loads(state_path.read_text())
        return bool(state.get("committed")) or any(
            (info or {}).get("good") for info in (state.get("slots") or {}).values()
        )
    except (OSError, ValueError, AttributeError, TypeError):
        return False
