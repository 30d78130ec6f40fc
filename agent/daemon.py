"""The agent daemon: wires the store, the model server, the API, the governor, metrics and
the optional MQTT link and OTA manager together, and runs them until SIGTERM.

Start order: telemetry opt-outs (before any runtime import), data dir, device key, the
security state record (agent/security_state.py; tampered = installs and commands refused), trusted
publishers, the installed bundle (verified again; a broken slot falls back to the last good
one), the governor, the API (TCP port written to ``data_dir/api.port``), then the link and
the updater. Stop order is the reverse, and in-flight requests are drained first.
SIGHUP re-reads the store (``edge-agent install`` sends it) and swaps to a newly installed bundle.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.api.app import ApiApp
from edgesdk.agent.api.http import HttpLimits, HttpServer
from edgesdk.agent.config import check_configured_files
from edgesdk.agent.events import EventBus
from edgesdk.agent.fsutil import atomic_write_bytes
from edgesdk.agent.governor.runner import Governor
from edgesdk.agent.governor.sensors import make_source
from edgesdk.agent.install_profiling import InstallProfiler
from edgesdk.agent.keyring import KeyFiles
from edgesdk.agent.memory_budget import MemoryBudget
from edgesdk.agent.metrics import InferenceStats, Metrics
from edgesdk.agent.model_set import ModelEntry, ModelSet
from edgesdk.agent.model_stores import ModelStores, NamedModelStore
from edgesdk.agent.profiling import SavedMeasurements, load_saved
from edgesdk.agent.serving import ModelServer
from edgesdk.agent.systemd_notify import Watchdog, notify_ready, notify_stopping

from edgesdk._version import __version__
from edgesdk.errors import AgentError, ConfigError, EdgeSDKError, ProfileError, RollbackError
from edgesdk.offline import disable_vendor_telemetry
from edgesdk.schemas.agent_config import AgentConfig
from edgesdk.schemas.common import Precision
from edgesdk.schemas.profile import DeviceProfile

if TYPE_CHECKING:  # the link, the updater, gRPC and the key types load when used, not at start
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from edgesdk.agent.api.grpc_server import GrpcServer
    from edgesdk.agent.link import AgentLink
    from edgesdk.agent.openers import OpenerFactory
    from edgesdk.agent.ota import UpdateManager
    from edgesdk.agent.ota.hooks import OtaHooks
    from edgesdk.agent.security_state import SecurityState
    from edgesdk.agent.trust import AgentTrust

log = logging.getLogger("edgesdk.agent")

PORT_FILE = "api.port"
GRPC_PORT_FILE = "grpc.port"
PID_FILE = "agent.pid"


class Agent:
    """One device agent. Construct, then ``run()`` (blocking) or use the parts directly."""

    def __init__(
        self, config: AgentConfig, *, profile: DeviceProfile | None = None, ota_hooks: OtaHooks | None = None
    ) -> None:
        disable_vendor_telemetry()  # before anything can import a runtime
        self.config = config
        # Fault-injection seams for the updater; only the test harness (tests/faulty_agent.py) passes one.
        self.ota_hooks = ota_hooks
        self.profile = profile or self._load_profile(config.profile)
        self.data_dir = Path(config.data_dir)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ConfigError(f"data_dir {str(self.data_dir)!r} cannot be created: {exc.strerror or exc}") from exc
        self.events = EventBus()
        self.measurements = SavedMeasurements(self.data_dir)  # edge-agent profile's figures
        stats = InferenceStats()
        # The default model's server: the one the API is given (it hands requests naming
        # another model to that model's server, agent/model_set.py).
        self.server = self._make_server(stats)
        # One A/B store per model under data_dir/models (a single-model data dir is migrated here).
        self.device_key_path = self._device_key_path()
        self.problems: list[str] = []  # what went wrong at start, shown in /v1/status
        # The trust floor, the release floors and the command ledger in one authenticated record
        # (agent/security_state.py): made with the device key, so missing or invalid = tampered.
        self.security = self._security_state()
        self.stores = ModelStores(self.data_dir, security=self.security)
        self.pins = {name: Precision(policy.precision) for name, policy in config.models.items() if policy.precision}
        self.trust = self._trust()
        self.keyring = KeyFiles(
            self.device_key_path, [Path(p) for p in config.publisher_keys], unseal=config.unseal, trust=self.trust
        )
        if self.trust is None and not config.publisher_keys:
            log.warning("no publisher_keys configured: no bundle can be verified, so none will be served")
        if config.unseal == "in_process":
            _ = self.device_key, self.trusted_publishers  # read now: a bad key file stops the start
        else:
            # The helper parses the key files when it opens a bundle (a bad one is then that
            # slot's reported problem); a missing one is still an error at start.
            self.keyring.check_files()
        check_configured_files(config)
        default_name = config.default_model or self.stores.default
        self.governor = self._make_governor(self.server, pinned=default_name in self.pins)
        self.metrics = Metrics(self.server, stats=stats, governor=self.governor, measured=self.measurements.current)
        self.models = ModelSet(
            self.stores,
            self.server,
            stats,
            make_entry=self._make_entry,
            budget=MemoryBudget(self.profile.memory.model_ram_budget_mb, self.profile.name),
            events=self.events,
            default_name=config.default_model,
            default_governor=self.governor,
            pins=self.pins,
        )
        self.metrics.attach_models(self.models)
        self._governors_running = False
        # Profiling at install (agent/install_profiling.py) times the default model once it
        # commits; the other models keep their host ladder until `edge-agent profile` measures them.
        self.profiler = InstallProfiler(
            config,
            serving=self._default_serving_key,
            committed=self._default_committed,
            measured=self.measurements.current,
            on_measured=self._follow_measured_ladder,
            emit=self.events.emit,
        )
        self.api: ApiApp | None = None
        self.http: HttpServer | None = None
        self.grpc: GrpcServer | None = None  # only when api.grpc.enabled
        self.port: int | None = None
        self.link: AgentLink | None = None
        self.updates: UpdateManager | None = None  # the default model's (each model has its own)
        self._gate: Any = None  # the command gate every model's updater shares (_command_gate)
        self.started_at = time.time()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.events.subscribe(self._log_event)

    # -- setup ------------------------------------------------------------------------------------

    def _make_server(self, stats: InferenceStats) -> ModelServer:
        config = self.config
        return ModelServer(
            profile=self.profile,
            events=self.events,
            allow_nonfinite=config.api.allow_nonfinite,
            runtime_options=self._runtime_options(),
            observe=stats.observe,
            count_error=stats.count_error,
            batching=config.api.batching,
            measured=self.measurements.current,
        )

    def _make_governor(self, server: ModelServer, *, pinned: bool) -> Governor:
        """A model's governor; a pinned model's never switches (ModelSet applies the pin)."""
        governor = self.config.governor
        return Governor(
            server,
            make_source(governor.source, trace_file=governor.trace_file),
            self.profile,
            events=self.events,
            poll_interval_s=governor.poll_interval_s,
            min_dwell_s=governor.min_dwell_s,
            enabled=governor.enabled and not pinned,
        )

    def _make_entry(self, name: str, store: NamedModelStore) -> ModelEntry:
        """The parts of a model beside the default one: its server, statistics and governor."""
        stats = InferenceStats()
        server = self._make_server(stats)
        governor = self._make_governor(server, pinned=name in self.pins)
        if self._governors_running:
            governor.start()
        return ModelEntry(name, server, stats, store, governor)

    @property
    def store(self) -> NamedModelStore:
        """The default model's A/B store (AgentError on a device with no model yet)."""
        entry = self.models.default_entry()
        if entry is None:
            raise AgentError("no model is installed on this device yet (edge-agent install FILE.edgepkg, or OTA)")
        return entry.store

    @staticmethod
    def _load_profile(name: str) -> DeviceProfile:
        from edgesdk.profiles import get_profile

        try:
            return get_profile(name)
        except ProfileError as exc:
            raise ConfigError(f"profile: {exc}") from exc

    def _runtime_options(self) -> dict[str, str]:
        threads = self.config.runtime_threads
        options = {"allow_spinning": "1" if self.config.runtime_spinning else "0"}
        # Unset: the runtime's default, or one thread for a model that runs faster so (ort_threads).
        return {**options, "intra_op_num_threads": str(threads) if threads else "auto"}

    def _trust(self) -> AgentTrust | None:
        if self.config.trust_document is None:
            return None
        from edgesdk.agent.trust import AgentTrust

        return AgentTrust(Path(self.config.trust_document), self.data_dir, events=self.events, state=self.security)

    def _security_state(self) -> SecurityState:
        from edgesdk.agent.security_state import SecurityState, state_key_provider

        state = SecurityState(self.data_dir, state_key_provider(self.device_key_path, unseal=self.config.unseal))
        try:
            if self._made_device_key:  # the record is made with the key, never later (strict rule)
                state.create()
            state.open()
        except EdgeSDKError as exc:  # the key cannot be derived (a bad key file): fail closed, say why
            state.problem = f"security state: {exc}"
        if state.problem is not None:
            self.problems.append(state.problem)
        return state

    def _report_security_state(self) -> None:
        """A ``security_state_tampered`` event (now that the link carries events) when the record
        was missing or invalid at start: installs, commands and trust updates are refused."""
        if self.security.problem is not None:
            self.events.emit("security_state_tampered", {"reason": self.security.problem})

    def _device_key_path(self) -> Path:
        path = self.config.device_key
        self._made_device_key = False
        if path is not None:
            return Path(path)  # configured: must exist (checked with the other key files)
        default = self.data_dir / "device.key"
        self._made_device_key = not default.exists()
        if self._made_device_key:
            from edgesdk import keys  # first start only: the crypto library is needed to make a key

            priv, pub = keys.generate_device_key(self.data_dir)
            log.info("created device key %s (public key %s)", priv, pub)
        return default

    # The Keyring port, for the parts (and callers) that take the agent as its keyring: the
    # keys as objects, read on first use (see edgesdk.agent.keyring).
    @property
    def device_key(self) -> X25519PrivateKey:
        return self.keyring.device_key

    @property
    def trusted_publishers(self) -> list[Ed25519PublicKey]:
        return self.keyring.trusted_publishers

    def device_public_key(self) -> bytes:
        """The raw public half of the device key (``device.pub``; never the private key here)."""
        return self.keyring.device_public_key()

    @property
    def trusted_operators(self) -> list[Ed25519PublicKey]:
        return self.keyring.trusted_operators

    def _open_bundles(self) -> OpenerFactory:
        """Where updates and sideloads verify and decrypt: the unseal helper unless configured
        ``unseal = "in_process"`` (see :mod:`edgesdk.agent.openers`). The helper is handed the
        trust document in force when it starts (it follows rotations)."""
        from edgesdk.agent.openers import opener_factory

        trust = self.trust
        return opener_factory(
            self.config.unseal,
            self.keyring,
            publisher_keys=[Path(p) for p in self.config.publisher_keys],
            device_key=self.device_key_path,
            trust_document=(lambda: trust.path) if trust is not None else None,
        )

    def _log_event(self, name: str, detail: dict[str, Any]) -> None:
        log.debug("event %s %s", name, detail)

    # -- the models ---------------------------------------------------------------------------------

    def load_installed(self) -> bool:
        """Verify each model's active slot and serve it (or its last good one). False when no
        model could be served.

        A slot whose bundle fails at start (signature or manifest when re-opened, or a GCM tag
        or plaintext hash while its variants load) is given up for the last good slot of that
        model, and the fallback is reported (``/v1/status`` problems, ``bundle_fallback``
        event); the other models are not touched. Once a model serves, its whole file is
        re-hashed in the background against the hash recorded at install, so rot in payloads
        the agent did not load is reported too.

        With ``unseal = "helper"`` the verifying and decrypting run in a helper process
        (:mod:`edgesdk.agent.unseal`) that exits when this returns.

        Each model's rollback floor is established here too, the same one its installs check:
        when it cannot be, or the model serving is below it (a fallback), ``/v1/status`` says so."""
        entries = self.models.entries()
        loaded = self._open_installed(entries)
        for entry in entries:
            self._report_rollback_floor(entry)
        return loaded

    def _report_rollback_floor(self, entry: ModelEntry) -> None:
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

    def _open_installed(self, entries: list[ModelEntry]) -> bool:
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

    def _load_models(self, entries: list[ModelEntry], unsealer: Any) -> bool:
        # In process the store and the server get the key objects; a helper reads the key files.
        try:
            publishers = self.trusted_publishers if unsealer is None else None
            device_key = self.device_key if unsealer is None else None
        except EdgeSDKError as exc:  # only when a helper could not start: keys unread until now
            log.error("cannot read the keys to open the bundle: %s", exc)
            self.problems.append(f"keys: {exc}")
            return False
        served = [self._load_model(entry, publishers, device_key, unsealer) for entry in entries]
        if not entries:
            log.info("no bundle installed yet; waiting for one (edge-agent install FILE.edgepkg, or OTA)")
        return any(served)

    def _load_model(self, entry: ModelEntry, publishers: Any, device_key: Any, unsealer: Any) -> bool:
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

    def _check_bundle_file_later(self, entry: ModelEntry, slot: Any) -> None:
        """Re-hash the serving slot's file on a background thread (see ``load_installed``)."""
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

    def install(self, path: Path) -> dict[str, Any]:
        """Sideload through the OTA install path (verify, budget, stage, smoke-test, activate, commit).

        The bundle's model name picks the store it installs into (each model has its own); the
        other models keep serving. Without the OTA module the same steps run here directly;
        either way the serving slot is kept until the new bundle has loaded. An expired trust
        document refuses it (new content)."""
        if self.trust is not None:
            self.trust.require_current()
        entry = self.models.entry(_bundle_model_name(path))
        updates = entry.updates
        if updates is None:
            try:
                updates = self._make_updater(entry)
            except ImportError:
                return self._install_directly(entry, path)
        state = updates.install_local(path)
        result = self._installed_summary(entry)
        result["state"] = state.value
        return result

    def _installed_summary(self, entry: ModelEntry) -> dict[str, Any]:
        slot = entry.store.active_slot
        info = entry.store.slot_info(slot) if slot else None
        info = info or {}
        return {
            "model": info.get("name"),
            "version": info.get("version"),
            "release": info.get("release"),
            "slot": slot,
            "sha256": info.get("sha256"),
            "variants": [v.id for v in entry.server.model.ladder] if entry.server.model else [],
        }

    def _install_directly(self, entry: ModelEntry, path: Path) -> dict[str, Any]:
        store = entry.store
        opener = self._open_bundles()()
        try:
            verified = opener.verify(
                path,
                profile=self.profile.name,
                installed_release=store.installed_release(),
                rollback_floor=store.rollback_floor(),
            )
            self.models.admit(entry.name, verified.manifest)
            slot = store.stage(verified)
            store.activate(slot)
            try:
                opener.serve(entry.server, verified)
            except EdgeSDKError:
                store.rollback()
                raise
        finally:
            opener.close()
        store.commit()
        manifest = verified.manifest
        self.events.emit(
            "installed",
            {
                "model": manifest.model.name,
                "version": manifest.model.version,
                "release": manifest.model.release,
                "slot": slot,
            },
        )
        return self._installed_summary(entry)

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
            self._open_installed(changed)
            for entry in changed:
                self._report_rollback_floor(entry)
        except Exception:  # noqa: BLE001 - runs from a signal; the models serving now must stay up
            log.exception("reload failed; the models loaded before keep serving")

    def _default_serving_key(self) -> tuple[str, int] | None:
        model = self.server.model
        return (model.name, model.release) if model is not None else None

    def _default_committed(self) -> Any:
        entry = self.models.default_entry()
        return entry.store.committed if entry is not None else None

    def _follow_measured_ladder(self, figures: Any) -> None:
        """After profiling at install: load the model again when the measured ladder drops a step
        it loaded (the swap is atomic; the model loaded now serves until the new load is in)."""
        entry = self.models.default_entry()
        if entry is None:
            return
        # Profiling ends at a time of its own: an update of the same model may have started, and
        # reloading the committed slot then would serve it over the new one in probation.
        with self._updater_for(entry.name).holding_off_updates() as idle:
            model = self.server.model
            if not idle or model is None or (model.name, model.release) != (figures.model, figures.release):
                return
            if not entry.store.committed:
                return
            dropped = [v.id for v in model.ladder if v.id not in figures.speed_ladder]
            if dropped:
                log.info("measured here: %s not a speed step; loading the model with the measured ladder", dropped)
                self._open_installed([entry])

    # -- status -------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What /v1/status shows: identity, the default model, every model, the memory budget,
        governor, sensors, store, problems."""
        default = self.models.default_entry()
        return {
            "device_id": self.config.device_id,
            "profile": self.profile.name,
            "agent_version": __version__,
            "uptime_s": round(time.time() - self.started_at, 1),
            "model": _status_model(self.server.running_model()),
            "variants": self.server.describe_variant_choices(),
            "governor": self.governor.status(),
            "temperatures_c": dict(self.governor.last_reading.temperatures_c),
            "power_source": self.governor.last_reading.power_source,
            "switch_count": self.server.switch_count,
            "store": _status_store(default) if default is not None else None,
            "models": [self._status_entry(entry) for entry in self.models.entries()],
            "memory": self.models.memory(),
            "problems": list(self.problems),
            "recent_events": [
                {"ts": round(ts, 3), "event": name, **detail} for ts, name, detail in list(self.events.recent)[-20:]
            ],
            "link": self.link is not None,
            "updates": default.updates.status() if default is not None and default.updates is not None else None,
            "trust": self.trust.status() if self.trust is not None else None,
            "security_state": self.security.status(),
            "measured": load_saved(self.data_dir),  # edge-agent profile's figures, if it ran
            "profiling": self.profiler.status(),  # profiling at install: running, done, failed (why)
        }

    def _status_entry(self, entry: ModelEntry) -> dict[str, Any]:
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

    # -- the link and the updaters, wired with their ports ------------------------------------------

    def _make_updater(self, entry: ModelEntry) -> UpdateManager:
        """A model's updater, given what it uses: its serving and slots, the keys, events, the
        link (if any), the device's command gate, the memory budget and the turn all models'
        updates take. ImportError when this agent was installed without the OTA module."""
        from edgesdk.agent.ota import UpdateManager
        from edgesdk.agent.ota.manager import transfer_settings

        return UpdateManager(
            entry.model_dir / "ota",
            device_id=self.config.device_id,
            serving=entry.server,
            slots=entry.store,
            keyring=self.keyring,
            profile_name=self.profile.name,
            link=self.link,
            events=self.events,
            max_inbound_bytes=self.config.mqtt.max_inbound_bytes,
            hooks=self.ota_hooks,
            open_bundles=self._open_bundles(),
            groups=tuple(self.config.mqtt.groups),
            clock_skew_s=self.config.ota.clock_skew_s,
            **transfer_settings(self.config),
            gate=self._command_gate(),
            admit=lambda manifest: self.models.admit(entry.name, manifest),
            turn=self.models.update_turn,
            listen=False,  # ModelUpdates routes the link's deployments and chunks by model
        )

    def _command_gate(self) -> Any:
        """The device's one command gate (freshness, audience, sequence), shared by every model's updater."""
        if self._gate is None:
            from edgesdk.agent.ota.freshness import CommandGate, SequenceLedger
            from edgesdk.agent.security_state import RecordLedgerStore

            ota_dir = self.data_dir / "ota"
            ota_dir.mkdir(exist_ok=True, mode=0o700)
            self._gate = CommandGate(
                SequenceLedger(ota_dir / "command_sequence.json", store=RecordLedgerStore(self.security)),
                device_id=self.config.device_id,
                groups=tuple(self.config.mqtt.groups),
                clock_skew_s=self.config.ota.clock_skew_s,
                max_validity_s=self.config.ota.max_command_validity_s,
            )
        return self._gate

    def _updater_for(self, name: str) -> UpdateManager:
        """The updater of model ``name`` (a new model's store, server and updater made here)."""
        entry = self.models.entry(name)
        if entry.updates is None:
            entry.updates = self._make_updater(entry)
        updates: UpdateManager = entry.updates
        return updates

    def _make_link(self) -> None:
        from edgesdk.agent.link import AgentLink

        self.link = AgentLink(
            self.config,
            telemetry=self.metrics,
            running_model=self.server,
            events=self.events,
            keyring=self.keyring,
            running_models=self.models,
        )
        self.metrics.attach_outbox(self.link.queue)

    def _connect_link(self) -> None:
        """Connect once every handler is subscribed: the client sends its subscriptions before
        the online presence, so a fleet that sees the device online can send it a deployment
        (not retained) without it falling between the connection and the subscription."""
        if self.link is None:
            return
        try:
            self.link.start()
            from edgesdk.agent.enrollment import announce_enrollment

            announce_enrollment(self, self.link)
        except EdgeSDKError as exc:
            log.error("MQTT link did not start: %s (serving goes on offline)", exc)
            self.problems.append(f"mqtt: {exc}")

    def _start_hooks(self) -> None:
        if self.config.mqtt.enabled:
            try:
                self._make_link()
            except ImportError as exc:
                log.error("mqtt.enabled but the MQTT link is not available: %s", exc)
            except EdgeSDKError as exc:
                log.error("MQTT link did not start: %s (serving goes on offline)", exc)
                self.problems.append(f"mqtt: {exc}")
        self._report_security_state()
        self._start_trust()
        updates = self._start_updates()
        if self.link is not None:  # a tampered device's way back: an operator-signed re-provision
            from edgesdk.agent.ota.reprovision import attach

            attach(self)
        self._connect_link()
        if updates:
            self._resume_updates()

    def _start_updates(self) -> bool:
        """The updater of each model and, with a link, the router of deployments and chunks
        (subscribed now, sent when the link connects); False when this agent has no OTA."""
        try:
            for entry in self.models.entries():
                self._updater_for(entry.name)
        except ImportError:
            log.debug("OTA updates not available in this agent")
            return False
        default = self.models.default_entry()
        self.updates = default.updates if default is not None else None
        if self.link is not None:
            from edgesdk.agent.ota.per_model import ModelUpdates

            keyring = self.keyring
            ModelUpdates(
                self.link,
                updater_for=self._updater_for,
                known=self.models.known,
                default_name=lambda: self.models.default_name,
                trusted_operators=lambda: keyring.trusted_operators,
                started=lambda: [e.updates for e in self.models.entries() if e.updates is not None],
                events=self.events,
            )
        return True

    def _resume_updates(self) -> None:
        for entry in self.models.entries():
            try:
                # _updater_for, not entry.updates: the default model named by models/index.json
                # may have got its entry only after the updaters were made (its store still empty).
                self._updater_for(entry.name).resume()
            except EdgeSDKError as exc:
                log.error("OTA resume of %s failed: %s", entry.name, exc)
                self.problems.append(f"ota {entry.name}: {exc}")

    def _start_trust(self) -> None:
        """Report an expired trust document (now that the link carries events) and take newer
        documents from the fleet's retained trust topic."""
        if self.trust is None:
            if self.config.publisher_keys:  # said by the running daemon only, not by every CLI command
                log.warning(
                    "no trust_document configured: publisher_keys verify bundles AND deployments, so a key that "
                    "signs deployments can also ship models (roles not separated; see docs/trust.md)"
                )
            return
        problem = self.trust.report_expiry()
        if problem:
            log.error("%s", problem)
            self.problems.append(problem)
        if self.link is not None:
            from edgesdk.protocol.topics import TRUST

            self.link.subscribe_fleet(TRUST, self.trust.on_message)

    def _guard_boot(self) -> None:
        """Before any model loads: if the last start died while a new model was on probation,
        count it (a crash loop rolls back) so a model that kills the agent cannot keep it down.
        Each model's update record is its own."""
        try:
            from edgesdk.agent.ota import guard_boot
        except ImportError:
            return
        for entry in self.models.entries():
            try:
                done = guard_boot(entry.model_dir, entry.store)
            except Exception as exc:  # noqa: BLE001 - a damaged OTA record must not keep the agent from serving
                log.error("OTA boot guard of %s failed: %s", entry.name, exc)
                self.problems.append(f"ota boot guard: {entry.name}: {exc}")
                continue
            if done:
                log.warning("OTA boot guard: %s: %s", entry.name, done)

    def _stop_hooks(self) -> None:
        parts: list[tuple[str, Any]] = [(f"updater of {e.name}", e.updates) for e in self.models.entries()]
        for name, part in [*parts, ("MQTT link", self.link)]:
            if part is None:
                continue
            try:
                part.stop()
            except Exception:  # noqa: BLE001 - shutting down: the other parts must still stop
                log.exception("stopping the %s failed; stopping the rest", name)

    def _governors(self) -> list[Governor]:
        others = [
            e.governor for e in self.models.entries() if e.governor is not None and e.governor is not self.governor
        ]
        return [self.governor, *others]

    # -- running ------------------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the exit code.

        The serving process is hardened first (no core file, not dumpable): it holds decrypted
        models, and a crash must not leave them on disk (:mod:`edgesdk.agent.hardening`)."""
        from edgesdk.agent.hardening import harden_process

        harden_process()
        try:
            import uvloop
        except ImportError:
            # The agent extra installs uvloop; without it (Windows, a bare install) the stdlib
            # loop serves the same API, slower per request.
            log.info("uvloop is not installed: serving on the stdlib asyncio event loop")
            return asyncio.run(self.serve())
        return uvloop.run(self.serve())

    def _start_grpc(self, api: ApiApp, http: HttpServer) -> GrpcServer | None:
        """The gRPC endpoint when ``api.grpc.enabled`` (grpc imported only then); its port is
        written to ``data_dir/grpc.port`` before ``api.port`` says the agent is ready."""
        api_config = self.config.api
        if not api_config.grpc.enabled:
            return None
        try:
            from edgesdk.agent.api.grpc_server import GrpcServer
        except ImportError as exc:
            raise AgentError(
                f"api.grpc.enabled is set but the grpc extra is missing ({exc}); pip install 'edgesdk[grpc]'"
            ) from exc
        server = GrpcServer(
            api,
            http.budget,
            max_message_bytes=api_config.max_body_bytes,
            max_decoded_bytes=http.limits.decoded_bytes,
        )
        port = server.start(api_config.grpc.host, api_config.grpc.port)
        atomic_write_bytes(self.data_dir / GRPC_PORT_FILE, f"{port}\n".encode(), mode=0o644)
        log.info("Open Inference Protocol over gRPC on %s:%d", api_config.grpc.host, port)
        return server

    def request_stop(self) -> None:
        """Ask a running agent to stop (thread-safe)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def _loop_turns(self) -> bool:
        """Watchdog health: the event loop answers within 5 s (a hung loop is a hung agent)."""
        import concurrent.futures

        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        loop.call_soon_threadsafe(done.set_result, True)
        try:
            return done.result(timeout=5)
        except concurrent.futures.TimeoutError:
            return False

    async def serve(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        api_config = self.config.api
        self.api = ApiApp(self.server, self.metrics, api_config, status=self.status)
        self.api.loop = self._loop
        self.http = HttpServer(
            self.api.handle,
            HttpLimits(
                max_body_bytes=api_config.max_body_bytes,
                header_timeout_s=api_config.header_timeout_s,
                body_timeout_s=api_config.body_timeout_s,
                keepalive_timeout_s=api_config.keepalive_timeout_s,
                max_connections=api_config.max_connections,
                max_connections_per_client=api_config.max_connections_per_client,
                min_rate_bytes_s=api_config.min_rate_bytes_s,
                min_rate_grace_s=api_config.min_rate_grace_s,
                max_inflight_bytes=api_config.max_inflight_bytes,
                max_decoded_bytes=api_config.max_decoded_bytes,
            ),
        )
        try:
            self.port = await self.http.listen_tcp(api_config.host, api_config.port)
            if api_config.unix_socket is not None:
                await self.http.listen_unix(str(api_config.unix_socket))
        except OSError as exc:
            raise AgentError(f"cannot listen on {api_config.host}:{api_config.port}: {exc.strerror or exc}") from exc
        self.grpc = self._start_grpc(self.api, self.http)
        if api_config.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning(
                "the inference API listens on %s, not on loopback only: anyone who can reach it can use it",
                api_config.host,
            )
        # Listening first: a taken port fails at once, and /healthz answers while a large model
        # loads (in a thread, so the loop keeps serving); /readyz says 503 until it is in.
        self._guard_boot()
        await self._loop.run_in_executor(None, self.load_installed)
        self._governors_running = True
        for governor in self._governors():
            governor.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._stop.set)
        self._loop.add_signal_handler(signal.SIGHUP, lambda: self._loop.run_in_executor(None, self.reload))  # type: ignore[union-attr]
        self._start_hooks()
        self.events.subscribe(self.profiler.on_event)
        self.profiler.consider("start")
        # The port file says "ready": written once every part (link, updater) has started.
        atomic_write_bytes(self.data_dir / PORT_FILE, f"{self.port}\n".encode(), mode=0o644)
        atomic_write_bytes(self.data_dir / PID_FILE, f"{os.getpid()}\n".encode(), mode=0o644)
        where = f"http://{api_config.host}:{self.port}" + (
            f" and {api_config.unix_socket}" if api_config.unix_socket else ""
        )
        running = self.server.running_model()
        log.info(
            "edge-agent %s ready on %s (device %s, profile %s, model %s)",
            __version__,
            where,
            self.config.device_id,
            self.profile.name,
            f"{running.name} {running.version} [{running.variant}]" if running else "none",
        )
        notify_ready(f"serving {running.name} {running.version}" if running else "no model installed")
        watchdog = Watchdog(self._loop_turns).start()
        await self._stop.wait()
        watchdog.stop()
        log.info("stopping: draining requests in flight")
        notify_stopping()
        await self.http.stop_listening()
        grpc_stopped = self.grpc.stop(api_config.request_timeout_s) if self.grpc is not None else None
        drained = await self.api.drain(api_config.request_timeout_s)
        if grpc_stopped is not None:
            await self._loop.run_in_executor(None, grpc_stopped.wait, api_config.request_timeout_s)
        if not drained:
            log.warning("stopped with requests still running after %.0f s", api_config.request_timeout_s)
        self.http.close_idle()
        self._stop_hooks()
        self.profiler.stop()
        for governor in self._governors():
            governor.stop()
        self.api.close()
        (self.data_dir / PORT_FILE).unlink(missing_ok=True)
        (self.data_dir / GRPC_PORT_FILE).unlink(missing_ok=True)
        (self.data_dir / PID_FILE).unlink(missing_ok=True)
        if api_config.unix_socket is not None:
            Path(api_config.unix_socket).unlink(missing_ok=True)
        log.info("stopped")
        return 0


def _bundle_model_name(path: Path) -> str:
    """The model a bundle file says it is (unverified: it only picks the store; the install
    verifies the bundle and refuses one whose verified name is another model's)."""
    from edgesdk.bundle import inspect_bundle
    from edgesdk.errors import UpdateError

    if not Path(path).is_file():
        raise UpdateError(f"bundle file {str(path)!r} not found")
    return inspect_bundle(path).manifest.model.name


def _status_model(running: Any) -> dict[str, Any] | None:
    if running is None:
        return None
    # "model" (the name) is the key /v1/status has always had; clients read it
    # (examples/device/client.py), so it stays beside RunningModel's own "name".
    return {"model": running.name, **running.model_dump(mode="json")}


def _status_store(entry: ModelEntry) -> dict[str, Any]:
    store = entry.store
    return {
        "active_slot": store.active_slot,
        "previous_slot": store.previous_slot,
        "committed": store.committed,
        "last_load": store.load_report,
    }
