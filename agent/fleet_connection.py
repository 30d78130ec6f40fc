"""The agent's side of the fleet: the MQTT link, one updater per model and what they share.

Started after the models load (``start``): the link is made, a tampered security record and an
expired trust document are reported, each model's updater is made with its ports, the router of
deployments and chunks (``ModelUpdates``), the trust topic, the re-provisioning topic and what
``on_link_made`` subscribes (the capture uploader's acks) are subscribed, and only then does the
link connect (its subscriptions go out before the online presence). Updates interrupted by the
last stop resume after that. ``guard_boot`` runs before any model loads; ``stop`` stops the
updaters, then the link.

An agent installed without the MQTT or OTA modules still serves: what is missing is logged,
and problems go to ``/v1/status``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.agent.ports import Keyring, RunningModelSource

from edgesdk.errors import EdgeSDKError
from edgesdk.schemas.agent_config import AgentConfig

if TYPE_CHECKING:
    from edgesdk.agent.device_models import DeviceModels, ModelParts
    from edgesdk.agent.events import EventBus
    from edgesdk.agent.link import AgentLink
    from edgesdk.agent.metrics import Metrics
    from edgesdk.agent.openers import OpenerFactory
    from edgesdk.agent.ota import UpdateManager
    from edgesdk.agent.ota.hooks import OtaHooks
    from edgesdk.agent.security_state import SecurityState
    from edgesdk.agent.trust import AgentTrust

log = logging.getLogger("edgesdk.agent")


class FleetConnection:
    """The link and the updaters, wired with their ports. It is also what the re-provisioner
    (``agent/ota/reprovision.py`` ``attach``) and the enroll request (``agent/enrollment.py``)
    read of the device: ``config``, ``trust``, ``problems``, ``security``, ``keyring``,
    ``events``, ``link`` and ``device_public_key()``."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        profile_name: str,
        models: DeviceModels,
        running_model: RunningModelSource,
        metrics: Metrics,
        keyring: Keyring,
        events: EventBus,
        security: SecurityState,
        trust: AgentTrust | None,
        problems: list[str],
        open_bundles: Callable[[], OpenerFactory],
        ota_hooks: OtaHooks | None = None,
    ) -> None:
        self.config, self.profile_name, self.models = config, profile_name, models
        self.running_model, self.metrics, self.keyring, self.events = running_model, metrics, keyring, events
        self.security, self.trust, self.problems = security, trust, problems
        self.open_bundles, self.ota_hooks = open_bundles, ota_hooks
        self.link: AgentLink | None = None
        self.updates: UpdateManager | None = None  # the default model's (each model has its own)
        self._gate: Any = None  # the command gate every model's updater shares (_command_gate)
        self.on_link_made: list[Callable[[AgentLink], None]] = []  # subscribe before it connects (capture acks)

    def device_public_key(self) -> bytes | None:
        """The raw public half of the device key (the enroll request carries it)."""
        return self.keyring.device_public_key()

    # -- start and stop -----------------------------------------------------------------------------

    def start(self) -> None:
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
            for subscribe in self.on_link_made:
                subscribe(self.link)
        self._connect_link()
        if updates:
            self._resume_updates()

    def stop(self) -> None:
        parts: list[tuple[str, Any]] = [(f"updater of {e.name}", e.updates) for e in self.models.entries()]
        for name, part in [*parts, ("MQTT link", self.link)]:
            if part is None:
                continue
            try:
                part.stop()
            except Exception:  # noqa: BLE001 - shutting down: the other parts must still stop
                log.exception("stopping the %s failed; stopping the rest", name)

    def guard_boot(self) -> None:
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

    # -- the updaters -------------------------------------------------------------------------------

    def updater_for(self, name: str) -> UpdateManager:
        """The updater of model ``name`` (a new model's store, server and updater made here)."""
        entry = self.models.entry(name)
        if entry.updates is None:
            entry.updates = self.make_updater(entry)
        updates: UpdateManager = entry.updates
        return updates

    def make_updater(self, entry: ModelParts) -> UpdateManager:
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
            profile_name=self.profile_name,
            link=self.link,
            events=self.events,
            max_inbound_bytes=self.config.mqtt.max_inbound_bytes,
            hooks=self.ota_hooks,
            open_bundles=self.open_bundles(),
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

            ota_dir = Path(self.config.data_dir) / "ota"
            ota_dir.mkdir(exist_ok=True, mode=0o700)
            self._gate = CommandGate(
                SequenceLedger(ota_dir / "command_sequence.json", store=RecordLedgerStore(self.security)),
                device_id=self.config.device_id,
                groups=tuple(self.config.mqtt.groups),
                clock_skew_s=self.config.ota.clock_skew_s,
                max_validity_s=self.config.ota.max_command_validity_s,
            )
        return self._gate

    def _start_updates(self) -> bool:
        """The updater of each model and, with a link, the router of deployments and chunks
        (subscribed now, sent when the link connects); False when this agent has no OTA."""
        try:
            for entry in self.models.entries():
                self.updater_for(entry.name)
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
                updater_for=self.updater_for,
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
                # updater_for, not entry.updates: the default model named by models/index.json
                # may have got its entry only after the updaters were made (its store still empty).
                self.updater_for(entry.name).resume()
            except EdgeSDKError as exc:
                log.error("OTA resume of %s failed: %s", entry.name, exc)
                self.problems.append(f"ota {entry.name}: {exc}")

    # -- the link -----------------------------------------------------------------------------------

    def _make_link(self) -> None:
        from edgesdk.agent.link import AgentLink

        self.link = AgentLink(
            self.config,
            telemetry=self.metrics,
            running_model=self.running_model,
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

    def _report_security_state(self) -> None:
        """A ``security_state_tampered`` event (now that the link carries events) when the record
        was missing or invalid at start: installs, commands and trust updates are refused."""
        if self.security.problem is not None:
            self.events.emit("security_state_tampered", {"reason": self.security.problem})

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
