"""The agent daemon's composition root: ``Agent`` builds the parts from the config and wires
them, each given only the ports it uses (agent/ports.py). The work is in one file per idea:

- agent/lifecycle.py: run, serve, signals, readiness, drain and stop (``AgentLifecycle``);
- agent/model_loading.py: serving what is installed, at start, on SIGHUP, after profiling;
- agent/sideload.py: ``edge-agent install FILE.edgepkg``;
- agent/fleet_connection.py: the MQTT link and each model's updater;
- agent/status.py: the ``/v1/status`` document;
- agent/device_identity.py: the device key and the security state record made with it.

Build order: telemetry opt-outs (before any runtime import), data dir, the default model's
server, device key, the security state record (tampered = installs and commands refused), the
trust document, the keys (read now when bundles open in process), the governor, metrics, the
models, then the pieces above. ``Agent``'s public methods (``run``, ``install``,
``load_installed``, ``reload``, ``status``, the key properties) delegate to them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.capture.start import start_capture
from edgesdk.agent.config import check_configured_files
from edgesdk.agent.device_identity import find_or_make_device_key, open_security_state
from edgesdk.agent.device_models import DeviceModels, ModelParts
from edgesdk.agent.drift.monitor import watch_drift
from edgesdk.agent.events import EventBus
from edgesdk.agent.fleet_connection import FleetConnection
from edgesdk.agent.governor.runner import Governor
from edgesdk.agent.governor.sensors import make_source
from edgesdk.agent.install_profiling import InstallProfiler
from edgesdk.agent.installed_models import InstalledModels, ModelSlotStore
from edgesdk.agent.keyring import KeyFiles
from edgesdk.agent.lifecycle import GRPC_PORT_FILE, PID_FILE, PORT_FILE, AgentLifecycle
from edgesdk.agent.memory_budget import ModelRamBudget
from edgesdk.agent.metrics import InferenceStats, Metrics
from edgesdk.agent.model_loading import InstalledModelLoader
from edgesdk.agent.profiling import SavedMeasurements
from edgesdk.agent.serving import ModelServer
from edgesdk.agent.shadow.wiring import attach as attach_shadow
from edgesdk.agent.sideload import Sideload
from edgesdk.agent.status import AgentStatus

from edgesdk.errors import AgentError, ConfigError, ProfileError
from edgesdk.offline import disable_vendor_telemetry
from edgesdk.schemas.agent_config import AgentConfig
from edgesdk.schemas.common import Precision
from edgesdk.schemas.profile import DeviceProfile

if TYPE_CHECKING:  # the link, the updater, gRPC and the key types load when used, not at start
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from edgesdk.agent.api.app import ApiApp
    from edgesdk.agent.api.grpc_server import GrpcServer
    from edgesdk.agent.api.http import HttpServer
    from edgesdk.agent.link import AgentLink
    from edgesdk.agent.openers import OpenerFactory
    from edgesdk.agent.ota import UpdateManager
    from edgesdk.agent.ota.hooks import OtaHooks
    from edgesdk.agent.trust import AgentTrust

log = logging.getLogger("edgesdk.agent")

__all__ = ["GRPC_PORT_FILE", "PID_FILE", "PORT_FILE", "Agent"]  # the files: agent/lifecycle.py


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
        # another model to that model's server, agent/device_models.py).
        self.server = self._make_server(stats)
        # One A/B store per model under data_dir/models (a single-model data dir is migrated here).
        self.device_key_path, made_key = find_or_make_device_key(config, self.data_dir)
        self.problems: list[str] = []  # what went wrong at start, shown in /v1/status
        # The trust floor, the release floors and the command ledger in one authenticated record
        # (agent/security_state.py): made with the device key, so missing or invalid = tampered.
        self.security = open_security_state(
            self.data_dir, self.device_key_path, unseal=config.unseal, made_key=made_key
        )
        if self.security.problem is not None:
            self.problems.append(self.security.problem)
        self.stores = InstalledModels(self.data_dir, security=self.security)
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
        # Before the model set: watching it for drift makes the entries of installed models, and
        # _make_entry reads this.
        self._governors_running = False
        self.models = DeviceModels(
            self.stores,
            self.server,
            stats,
            make_entry=self._make_entry,
            budget=ModelRamBudget(self.profile.memory.model_ram_budget_mb, self.profile.name),
            events=self.events,
            default_name=config.default_model,
            default_governor=self.governor,
            pins=self.pins,
        )
        self.metrics.attach_models(self.models)
        self.drift = watch_drift(self.models, self.events, self.metrics)  # issue 41: drift in telemetry
        # The link and each model's updater (agent/fleet_connection.py), made and started in serve().
        self.fleet = FleetConnection(
            config,
            profile_name=self.profile.name,
            models=self.models,
            running_model=self.server,
            metrics=self.metrics,
            keyring=self.keyring,
            events=self.events,
            security=self.security,
            trust=self.trust,
            problems=self.problems,
            open_bundles=self._open_bundles,
            ota_hooks=ota_hooks,
        )
        attach_shadow(self.fleet, self.models)  # each updater's probation shadow: free budget, governor pressure
        # issue 41: off unless [capture] rate > 0; uploads through the link once serve() made it
        self.capture = start_capture(
            config, self.models, self.data_dir, link=lambda: self.fleet.link, when_linked=self.fleet.on_link_made.append
        )
        self.loader = InstalledModelLoader(
            config,
            self.profile,
            models=self.models,
            default_server=self.server,
            keyring=self.keyring,
            device_key_path=self.device_key_path,
            trust=self.trust,
            events=self.events,
            problems=self.problems,
            updater_for=self.fleet.updater_for,
        )
        self.sideload = Sideload(
            models=self.models,
            trust=self.trust,
            make_updater=self.fleet.make_updater,
            open_bundles=self._open_bundles,
            profile_name=self.profile.name,
            events=self.events,
        )
        # Profiling at install (agent/install_profiling.py) times the default model once it
        # commits; the other models keep their host ladder until `edge-agent profile` measures them.
        self.profiler = InstallProfiler(
            config,
            serving=self._default_serving_key,
            committed=self._default_committed,
            measured=self.measurements.current,
            on_measured=self.loader.follow_measured_ladder,
            emit=self.events.emit,
        )
        self.status_report = AgentStatus(
            config,
            self.profile,
            server=self.server,
            governor=self.governor,
            models=self.models,
            events=self.events,
            problems=self.problems,
            trust=self.trust,
            security=self.security,
            profiler=self.profiler,
            data_dir=self.data_dir,
            linked=lambda: self.fleet.link is not None,
        )
        self.lifecycle = AgentLifecycle(
            config, self.profile.name, server=self.server, metrics=self.metrics, status=self.status, parts=self
        )
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
        """A model's governor; a pinned model's never switches (DeviceModels applies the pin)."""
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

    def _make_entry(self, name: str, store: ModelSlotStore) -> ModelParts:
        """The parts of a model beside the default one: its server, statistics and governor."""
        stats = InferenceStats()
        server = self._make_server(stats)
        governor = self._make_governor(server, pinned=name in self.pins)
        if self._governors_running:
            governor.start()
        return ModelParts(name, server, stats, store, governor)

    @property
    def store(self) -> ModelSlotStore:
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

    # -- the models: loading what is installed (agent/model_loading.py), the sideload (agent/sideload.py)

    def load_installed(self) -> bool:
        """Verify each model's active slot and serve it (or its last good one); False when no
        model could be served (see :mod:`edgesdk.agent.model_loading`)."""
        return self.loader.load_installed()

    def reload(self) -> None:
        """SIGHUP: serve what each model's store says is active now, where it changed."""
        self.loader.reload()

    def install(self, path: Path) -> dict[str, Any]:
        """Sideload through the OTA install path (see :mod:`edgesdk.agent.sideload`)."""
        return self.sideload.install(path)

    def _default_serving_key(self) -> tuple[str, int] | None:
        model = self.server.model
        return (model.name, model.release) if model is not None else None

    def _default_committed(self) -> Any:
        entry = self.models.default_entry()
        return entry.store.committed if entry is not None else None

    @property
    def link(self) -> AgentLink | None:
        """The MQTT link, once ``serve()`` made it (None without one)."""
        return self.fleet.link

    @property
    def updates(self) -> UpdateManager | None:
        """The default model's updater, once ``serve()`` started the updaters (each model has its own)."""
        return self.fleet.updates

    def status(self) -> dict[str, Any]:
        """What /v1/status shows (agent/status.py)."""
        return self.status_report.document()

    def _governors(self) -> list[Governor]:
        others = [
            e.governor for e in self.models.entries() if e.governor is not None and e.governor is not self.governor
        ]
        return [self.governor, *others]

    # -- the RunningParts port: what the lifecycle (agent/lifecycle.py) starts and stops -------------

    def guard_boot(self) -> None:
        self.fleet.guard_boot()

    def start_governors(self) -> None:
        self._governors_running = True  # a model added from now on starts its governor at once
        for governor in self._governors():
            governor.start()

    def start_parts(self) -> None:
        self.fleet.start()
        self.events.subscribe(self.profiler.on_event)
        self.profiler.consider("start")

    def stop_parts(self) -> None:
        self.fleet.stop()
        self.profiler.stop()
        for governor in self._governors():
            governor.stop()

    # -- running (agent/lifecycle.py) ----------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the exit code (see :mod:`edgesdk.agent.lifecycle`)."""
        return self.lifecycle.run()

    async def serve(self) -> int:
        return await self.lifecycle.serve()

    def request_stop(self) -> None:
        """Ask a running agent to stop (thread-safe)."""
        self.lifecycle.request_stop()

    @property
    def api(self) -> ApiApp | None:
        return self.lifecycle.api

    @property
    def http(self) -> HttpServer | None:
        return self.lifecycle.http

    @property
    def grpc(self) -> GrpcServer | None:
        return self.lifecycle.grpc

    @property
    def port(self) -> int | None:
        """The API's TCP port, once ``serve()`` listens."""
        return self.lifecycle.port
