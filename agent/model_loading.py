"""Serving what is installed: each model's active slot at start, again on SIGHUP, and again
after profiling at install drops a step from the ladder.

A slot whose bundle fails at start (signature or manifest when re-opened, or a GCM tag or
plaintext hash while its variants load) is given up for the last good slot of that model, and
the fallback is reported (``/v1/status`` problems, ``bundle_fallback`` event); the other models
are not touched. Once a model serves, its whole file is re-hashed in the background against the
hash recorded at install, so rot in payloads the agent did not load is reported too.

With ``unseal = "helper"`` the verifying and decrypting run in a helper process
(:mod:`edgesdk.agent.unseal`) that exits when the load returns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.ports import EventSink, Keyring

from edgesdk.errors import AgentError, EdgeSDKError, RollbackError
from edgesdk.schemas.agent_config import AgentConfig
from edgesdk.schemas.profile import DeviceProfile

if TYPE_CHECKING:
    from edgesdk.agent.device_models import DeviceModels, ModelParts
    from edgesdk.agent.ota import UpdateManager
    from edgesdk.agent.serving import ModelServer
    from edgesdk.agent.trust import AgentTrust

log = logging.getLogger("edgesdk.agent")


class InstalledModelLoader:
    """Loads each model's active slot into its server; what goes wrong goes to ``problems``."""

    def __init__(
        self,
        config: AgentConfig,
        profile: DeviceProfile,
        *,
        models: DeviceModels,
        default_server: ModelServer,
        keyring: Keyring,
        device_key_path: Path,
        trust: AgentTrust | None,
        events: EventSink,
        problems: list[str],
        updater_for: Callable[[str], UpdateManager],
    ) -> None:
        self.config, self.profile, self.models, self.default_server = config, profile, models, default_server
        self.keyring, self.device_key_path, self.trust = keyring, device_key_path, trust
        self.events, self.problems, self.updater_for = events, problems, updater_for

    def load_installed(self) -> bool:
        """Verify each model's active slot and serve it (or its last good one). False when no
        model could be served. Each model's rollback floor is established here too, the same one
        its installs check: when it cannot be, or the model serving is below it (a fallback),
        ``/v1/status`` says so."""
        entries = self.models.entries()
        loaded = self.open_installed(entries)
        for entry in entries:
            self._report_rollback_floor(entry)
        return loaded

    def reload(self) -> None:
        """Serve what each model's store says is active now, where it changed (SIGHUP: a model
        ``edge-agent install`` installed, maybe a new one); re-read the trust document."""
        if self.trust is not None:
            self.trust.reload()  # edge-agent trust install may have replaced it
        changed = []
        for entry in self.models.entries():
            entry.store.reload()
            store = entry.store
            info = store.slot_info(store.active_slot) if store.active_slot else None
            current = entry.server.model
            if info and current and info.get("sha256") == current.bundle_sha256:
                continue
            if info:
                changed.append(entry)
        if not changed:
            log.info("reload: every active bundle is already serving")
            return
        log.info("reload: loading %s", ", ".join(e.name for e in changed))
        try:
            self.open_installed(changed)
            for entry in changed:
                self._report_rollback_floor(entry)
        except Exception:  # noqa: BLE001 - runs from a signal; the models serving now must stay up
            log.exception("reload failed; the models loaded before keep serving")

    def follow_measured_ladder(self, figures: Any) -> None:
        """After profiling at install: load the model again when the measured ladder drops a step
        it loaded (the swap is atomic; the model loaded now serves until the new load is in)."""
        entry = self.models.default_entry()
        if entry is None:
            return
        # Profiling ends at a time of its own: an update of the same model may have started, and
        # reloading the committed slot then would serve it over the new one in probation.
        with self.updater_for(entry.name).holding_off_updates() as idle:
            model = self.default_server.model
            if not idle or model is None or (model.name, model.release) != (figures.model, figures.release):
                return
            if not entry.store.committed:
                return
            dropped = [v.id for v in model.ladder if v.id not in figures.speed_ladder]
            if dropped:
                log.info("measured here: %s not a speed step; loading the model with the measured ladder", dropped)
                self.open_installed([entry])

    def _report_rollback_floor(self, entry: ModelParts) -> None:
        try:
            floor = entry.store.rollback_floor()
        except RollbackError as exc:
            problem = f"rollback floor: {exc}"
        else:
            model = entry.server.model
            if floor is None or model is None or model.release >= floor:
                return
            problem = (
                f"rollback floor: {entry.name} serving release {model.release} (a fallback or an operator rollback) "
                f"below this device's floor {floor}; installs below {floor} stay refused"
            )
        if problem not in self.problems:  # a SIGHUP reload finds the same
            log.error("%s", problem)
            self.problems.append(problem)

    def open_installed(self, entries: list[ModelParts]) -> bool:
        if self.config.unseal == "in_process":
            return self._load_models(entries, None)
        from edgesdk.agent.unseal import Unsealer

        with Unsealer(
            publisher_keys=self.config.publisher_keys,
            device_key=self.device_key_path,
            trust_document=self.trust.path if self.trust is not None else None,
        ) as unsealer:
            if any(entry.store.active_slot is not None for entry in entries):
                try:
                    unsealer.start()
                except AgentError as exc:
                    # Serving beats the memory saving: a device whose interpreter cannot start a
                    # child (an odd packaging, a seccomp profile) still gets its model.
                    log.warning("%s; opening the bundle in this process instead", exc)
                    self.problems.append(f"unseal: {exc}; opened in process")
                    return self._load_models(entries, None)
            return self._load_models(entries, unsealer)

    def _load_models(self, entries: list[ModelParts], unsealer: Any) -> bool:
        # In process the store and the server get the key objects; a helper reads the key files.
        try:
            publishers = self.keyring.trusted_publishers if unsealer is None else None
            device_key = self.keyring.device_key if unsealer is None else None
        except EdgeSDKError as exc:  # only when a helper could not start: keys unread until now
            log.error("cannot read the keys to open the bundle: %s", exc)
            self.problems.append(f"keys: {exc}")
            return False
        served = [self._load_model(entry, publishers, device_key, unsealer) for entry in entries]
        if not entries:
            log.info("no bundle installed yet; waiting for one (edge-agent install FILE.edgepkg, or OTA)")
        return any(served)

    def _load_model(self, entry: ModelParts, publishers: Any, device_key: Any, unsealer: Any) -> bool:
        """Serve one model's active slot (or its last good one); its problems are reported, named."""
        store, server = entry.store, entry.server
        decrypt = unsealer.decrypt if unsealer is not None else None
        verified = store.load_active(publishers, self.profile, verifier=unsealer)
        report = dict(store.load_report)
        problems = [f"{entry.name}: {p}" for p in report.get("problems", [])]
        broken_slot = None  # the first slot that verified but could not serve
        while verified is not None:
            try:
                server.swap(verified, device_key, decrypt=decrypt)
            except EdgeSDKError as exc:
                problem = f"{entry.name}: slot {store.active_slot}: cannot serve: {exc}"
                problems.append(problem)
                log.error("%s", problem)
                broken_slot = broken_slot or store.active_slot
                if store.rollback() is None:
                    break
                verified = store.load_active(publishers, self.profile, verifier=unsealer)
                problems.extend(f"{entry.name}: {p}" for p in store.load_report.get("problems", []))
                continue
            fell_back = bool(report.get("fell_back")) or broken_slot is not None
            slot = store.active_slot
            if broken_slot is not None:
                log.warning("%s: started on last good slot %s instead of broken slot %s", entry.name, slot, broken_slot)
            store.load_report = {"slot": slot, "fell_back": fell_back, "problems": problems}
            self.problems.extend(problems)
            if fell_back:
                self.events.emit(
                    "bundle_fallback", {"model": entry.name, "slot": slot, "problems": "; ".join(problems)}
                )
            self._check_bundle_file_later(entry, slot)
            return True
        self.problems.extend(problems)
        return False

    def _check_bundle_file_later(self, entry: ModelParts, slot: Any) -> None:
        """Re-hash the serving slot's file on a background thread (see the module's docstring)."""
        model = entry.server.model
        if slot is None or model is None or model.bundle_sha256 is None:
            return
        if entry.bundle_checked == (slot, model.bundle_sha256):
            return  # a SIGHUP reload of the same bundle

        def check() -> None:
            try:
                problem = entry.store.check_file(slot)
            except Exception as exc:  # noqa: BLE001 - a background check must never take the agent down
                problem = f"slot {slot}: background check failed: {exc}"
            if problem:
                problem = f"{entry.name}: {problem}"
                log.error("%s", problem)
                self.problems.append(problem)
                self.events.emit("bundle_damaged", {"model": entry.name, "slot": slot, "problem": problem})
            else:
                log.info("%s slot %s: bundle file matches the hash recorded at install", entry.name, slot)

        entry.bundle_checked = (slot, model.bundle_sha256)
        threading.Thread(target=check, name="edgesdk-bundle-check", daemon=True).start()
