"""UpdateManager: the agent's entry point to over-the-air updates.

The daemon creates one per agent and calls :meth:`UpdateManager.resume` at start. Deployments
arrive from the MQTT link (:meth:`handle_deployment`: signature checked before anything else, then
freshness, audience and replay, see :mod:`edgesdk.agent.ota.freshness`), sideloads from ``edge-agent install`` (:meth:`install_local`). One worker thread runs the state
machine, so the link and the API never block on an update and two updates never interleave.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from edgesdk.agent.openers import OpenerFactory
from edgesdk.agent.ota.freshness import Admission, CommandGate, CommandRefused, ReportBudget, SequenceLedger
from edgesdk.agent.ota.hooks import NO_HOOKS, OtaHooks
from edgesdk.agent.ota.http_fetch import HttpSettings
from edgesdk.agent.ota.machine import UpdateMachine
from edgesdk.agent.ota.record import StateFile
from edgesdk.agent.ota.states import RESTING_STATES, UpdateState
from edgesdk.agent.ota.target import AgentUpdateTarget
from edgesdk.agent.ota.transfer import TransferLimits
from edgesdk.agent.ports import EventSink, Keyring, Serving, Slots, UpdateChannel

from edgesdk.errors import EdgeSDKError, UpdateError
from edgesdk.protocol.signing import Unverified, check_deployment, command_digest
from edgesdk.protocol.topics import OTA_CHUNK_DATA, OTA_DEPLOYMENT, OTA_STATUS
from edgesdk.schemas.messages import CommandRefusal, Deployment, HealthCriteria, OtaStatus

log = logging.getLogger(__name__)

#: Bytes of a chunk frame beyond the chunk itself (magic, length, JSON header).
_FRAME_HEADROOM = 4096


def transfer_settings(config: Any) -> dict[str, Any]:
    """``transfer_limits`` and ``http_settings`` of an :class:`UpdateManager`, from the agent's
    config (``[ota]``; the fleet CA is the one named for artifacts, else the MQTT link's)."""
    ota = config.ota
    return {
        "transfer_limits": TransferLimits(
            min_rate_bytes_s=ota.download_min_rate_bytes_s,
            window_s=ota.download_rate_window_s,
            deadline_min_s=ota.download_deadline_min_s,
            deadline_max_s=ota.download_deadline_max_s,
        ),
        "http_settings": HttpSettings(
            ca_file=ota.http_ca_file or (config.mqtt.tls.ca_file if config.mqtt.tls else None),
            redirect_hosts=tuple(h.lower() for h in ota.http_redirect_hosts),
        ),
    }


class UpdateManager:
    """Owns the update state machine of one agent."""

    def __init__(
        self,
        ota_dir: Path,
        *,
        device_id: str,
        serving: Serving,
        slots: Slots,
        keyring: Keyring,
        profile_name: str | None,
        link: UpdateChannel | None = None,
        events: EventSink | None = None,
        max_inbound_bytes: int = 1024 * 1024,
        hooks: OtaHooks | None = None,
        open_bundles: OpenerFactory | None = None,
        groups: tuple[str, ...] | list[str] = (),
        clock_skew_s: float | None = None,
        max_command_validity_s: float | None = None,
        gate: CommandGate | None = None,
        transfer_limits: TransferLimits | None = None,
        http_settings: HttpSettings | None = None,
        admit: Callable[[Any], None] | None = None,
        turn: threading.Lock | None = None,
        listen: bool = True,
    ) -> None:
        """``gate`` replaces the freshness/audience/replay checks (benchmarks compare with and
        without them); production passes none and gets the real checks over ``ota_dir`` (a
        device with several models passes one gate shared by every model's updater).

        With several models (agent/ota/per_model.py): ``admit`` refuses a verified bundle before
        it is staged (the memory budget), ``turn`` is held while a job runs so updates of
        different models run one after another, and ``listen=False`` leaves the link's
        deployment and chunk topics to the dispatcher that routes them by model."""
        hooks = hooks or NO_HOOKS  # test seams (tests/faulty_agent.py); production passes none
        self.device_id = device_id
        self.keyring = keyring
        self.link = link
        self.events = events
        self.max_inbound_bytes = max_inbound_bytes
        self._unverified_reports = ReportBudget()
        self.ota_dir = Path(ota_dir)
        self.ota_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.gate = gate or CommandGate(
            SequenceLedger(self.ota_dir / "command_sequence.json"),
            device_id=device_id,
            groups=groups,
            **({"clock_skew_s": clock_skew_s} if clock_skew_s is not None else {}),
            **({"max_validity_s": max_command_validity_s} if max_command_validity_s is not None else {}),
        )
        self.target = AgentUpdateTarget(
            self.ota_dir,
            device_id=device_id,
            serving=serving,
            slots=slots,
            keyring=keyring,
            profile_name=profile_name,
            link=link,
            publish=self._publish,
            hooks=hooks,
            open_bundles=open_bundles,
            transfer_limits=transfer_limits,
            http_settings=http_settings,
            admit=admit,
        )
        self._turn = turn
        self.machine = UpdateMachine(
            self.target,
            StateFile(self.ota_dir / "state.json"),
            device_id=self.device_id,
            on_state_saved=hooks.after_state_saved,
        )
        self._jobs: queue.Queue[Callable[[], object]] = queue.Queue()
        self._stopping = False
        self._idle = threading.Event()
        self._idle.set()
        self._worker: threading.Thread | None = None
        self._lock = threading.RLock()
        if link is not None and listen:
            link.subscribe(OTA_DEPLOYMENT, self.handle_deployment)
            link.subscribe(OTA_CHUNK_DATA, self.target.on_chunk_frame)

    # -- lifecycle ----------------------------------------------------------------------------

    def resume(self) -> UpdateState:
        """Continue an update the last run left behind (in the background); returns the saved state."""
        saved = self.machine.state
        if saved in RESTING_STATES:
            # Nothing half done: re-report the truth now, so the worker is free for the first
            # deployment that arrives right after start (instead of answering "busy").
            if saved is not UpdateState.IDLE:
                self.machine.resume()
        else:
            self._submit(self.machine.resume)
        return saved

    def stop(self) -> None:
        """Stop the worker after the current job (used by the daemon at shutdown)."""
        # No cancel: an interrupted update is resumed at the next start like after a power loss.
        self._stopping = True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no update work is queued or running (tests, install_local)."""
        return self._idle.wait(timeout)

    @contextlib.contextmanager
    def holding_off_updates(self) -> Iterator[bool]:
        """Hold off new updates of this model for the block; yields whether none is running now.

        For work that must not interleave with an update: a reload of the committed model that
        found an update idle must not serve that model over one activated meanwhile. A deployment
        that arrives during the block waits for it (its handler takes the same lock)."""
        with self._lock:
            yield not self.machine.busy and self._idle.is_set()

    @property
    def state(self) -> UpdateState:
        return self.machine.state

    def status(self) -> dict[str, Any]:
        """For the agent's status page."""
        record = self.machine.record
        return {
            "state": record.state.value,
            "deployment_id": record.deployment.deployment_id if record.deployment else None,
            "reason": record.reason,
            "updated": record.updated.isoformat() if record.updated else None,
        }

    # -- entry points -------------------------------------------------------------------------

    def handle_deployment(self, payload: bytes) -> None:
        """A message on ``ota/deployment`` (device or group topic). Never raises for bad input.

        A message that does not parse or whose signature does not verify gets no ``ota/status``
        (nobody proved that the deployment id it names is theirs: answering FAILED for it would
        let anyone on the broker fail a real rollout), only a rate-limited ``ota_refused`` event
        with its digest. A signed command this device refuses is answered with a FAILED status
        carrying the command's digest, which the operator matches against what it issued."""
        digest = command_digest(payload)
        try:
            deployment = Deployment.parse_json_clear(payload, source="deployment message")
        except EdgeSDKError as exc:
            self._report_unverified(CommandRefusal(command_sha256=digest, why="malformed", reason=str(exc)[:1024]))
            return
        try:
            checked = check_deployment(deployment, self.keyring.trusted_operators)
        except EdgeSDKError as exc:  # no operator key may sign (a trust document without the role)
            checked = Unverified("unknown_key", f"deployment {deployment.deployment_id!r}: {exc}")
        if isinstance(checked, Unverified):
            self._report_unverified(
                CommandRefusal(
                    command_sha256=digest,
                    why=checked.why,
                    reason=checked.message[:1024],
                    deployment_id=deployment.deployment_id,
                )
            )
            return
        signer = checked
        # Only a signed command reaches the gate, so nobody but an operator can make the device
        # write its sequence ledger (or publish refusals quoting attacker-chosen fields).
        try:
            admission = self.gate.admit(deployment, signer)
        except CommandRefused as exc:
            log.warning("refused deployment %s (%s): %s", deployment.deployment_id, exc.why, exc)
            refusal = CommandRefusal(
                command_sha256=digest, why=exc.why, reason=str(exc)[:1024], deployment_id=deployment.deployment_id
            )
            self.agent_event("ota_refused", refusal.model_dump())
            self._refuse(deployment, str(exc), command_sha256=digest)
            return
        except OSError as exc:  # the ledger could not be written: acting would reopen the window
            log.error("refused deployment %s: sequence ledger not written: %s", deployment.deployment_id, exc)
            self._refuse(
                deployment, f"could not record the command's sequence ({exc}); retry later", command_sha256=digest
            )
            return
        if admission is Admission.REPEAT:
            self._republish()  # the same message again (QoS 1 redelivery, a resend): report, do nothing
            return
        self.accept(deployment, command_sha256=digest)

    def _report_unverified(self, refusal: CommandRefusal) -> None:
        """The ``ota_refused`` event (and log line) of a message that proves no sender, within the
        rate limit: anyone who can publish on the device's topic can send these."""
        if self._unverified_reports.take():
            log.warning(
                "refused deployment message %s (%s): %s", refusal.command_sha256[:12], refusal.why, refusal.reason
            )
            self.agent_event("ota_refused", refusal.model_dump())
        else:
            log.debug(
                "refused deployment message %s (%s), not reported: rate limit", refusal.command_sha256[:12], refusal.why
            )

    def accept(self, deployment: Deployment, *, command_sha256: str | None = None) -> None:
        """Act on a deployment whose signature, freshness, audience and sequence were checked;
        ``command_sha256`` (the message's digest) goes with a refusal."""
        record = self.machine.record
        current = record.deployment.deployment_id if record.deployment else None
        same = current == deployment.deployment_id
        if deployment.action == "cancel":
            if same and self.machine.busy:
                self.machine.cancel(f"cancelled by operator (deployment {deployment.deployment_id})")
            elif same:
                self._republish()
            return
        if deployment.action == "rollback":
            if same and self.machine.busy:
                self.machine.cancel("rollback requested by operator")
            elif same and record.state is UpdateState.COMMITTED:
                self._submit(self.machine.rollback_committed)
            elif same:
                self._republish()
            else:
                self._refuse(
                    deployment,
                    f"cannot roll back {deployment.deployment_id!r}: the last update here is {current!r}",
                    command_sha256=command_sha256,
                )
            return
        if same:
            self._republish()  # a repeated message (retry, retained, reconnect): report, do nothing
            return
        if not deployment.artifact_sources() and deployment.chunk_size + _FRAME_HEADROOM > self._max_inbound_bytes():
            self._refuse(
                deployment,
                f"chunk_size {deployment.chunk_size} does not fit this device's MQTT message limit "
                f"({self._max_inbound_bytes()} bytes); use smaller chunks or a url",
                command_sha256=command_sha256,
            )
            return
        with self._lock:
            if self.machine.busy or not self._idle.is_set():
                self._refuse(
                    deployment,
                    f"device is busy with deployment {current!r} ({record.state.value}); "
                    "cancel it or retry when it finishes",
                    command_sha256=command_sha256,
                )
                return
            self._submit(lambda: self._start(deployment, command_sha256))

    def install_local(self, path: Path | str, *, probation_s: float = 0.0, timeout: float | None = None) -> UpdateState:
        """Sideload a bundle file through the same states as an OTA update; returns the final state.

        Raises UpdateError with the reason when the update did not commit."""
        source = Path(path)
        if not source.is_file():
            raise UpdateError(f"bundle file {str(source)!r} not found")
        digest = hashlib.sha256()
        with open(source, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        sha = digest.hexdigest()
        from edgesdk.bundle import inspect_bundle

        model = inspect_bundle(source).manifest.model  # display data only; VERIFYING checks everything
        now = datetime.now(timezone.utc)
        # A sideload is the device's own command, never checked by the gate: sequence 0 is
        # below any operator command, and the expiry only has to outlast this call.
        deployment = Deployment(
            deployment_id=f"local-{sha[:12]}-{uuid.uuid4().hex[:6]}",
            issued_at=now,
            expires_at=now + timedelta(days=1),
            sequence=0,
            targets=[self.device_id],
            model_name=model.name,
            model_version=model.version,
            release=model.release,
            bundle_sha256=sha,
            bundle_size=source.stat().st_size,
            health=HealthCriteria(probation_s=probation_s),
        )
        staged_copy = self.ota_dir / f"{deployment.deployment_id}.edgepkg"
        shutil.copyfile(source, staged_copy)  # still encrypted; the machine works from its own copy
        with self._lock:
            if self.machine.busy or not self._idle.is_set():
                staged_copy.unlink(missing_ok=True)
                raise UpdateError(f"an update is in progress ({self.machine.state.value}); retry when it finishes")
            self._submit(lambda: self._start(deployment))
        self.wait_idle(timeout)
        record = self.machine.record
        if record.state is not UpdateState.COMMITTED or record.deployment != deployment:
            raise UpdateError(f"install of {source} ended {record.state.value}: {record.reason}")
        return record.state

    # -- internals ----------------------------------------------------------------------------

    def _start(self, deployment: Deployment, command_sha256: str | None = None) -> None:
        try:
            self.machine.start(deployment)
        except UpdateError as exc:  # raced with another start: refuse the newcomer, keep the first
            self._refuse(deployment, str(exc), command_sha256=command_sha256)

    def _submit(self, job: Callable[[], object]) -> None:
        with self._lock:
            self._idle.clear()
            self._jobs.put(job)
            if self._worker is None:
                self._worker = threading.Thread(target=self._run_jobs, name="ota-update", daemon=True)
                self._worker.start()

    def _run_jobs(self) -> None:
        while True:
            with self._lock:
                if self._jobs.empty() or self._stopping:
                    self._worker = None
                    self._idle.set()
                    return
                job = self._jobs.get_nowait()
            try:
                if self._turn is None:
                    job()
                else:
                    with self._turn:  # another model's update finishes first
                        job()
            except Exception:  # noqa: BLE001 - the worker must survive a bug in one job
                log.exception("update job failed")

    def _max_inbound_bytes(self) -> int:
        return self.max_inbound_bytes

    def refuse(self, deployment: Deployment, reason: str, *, command_sha256: str | None = None) -> None:
        """Report (FAILED, with ``reason``) a signed deployment this device will not run (the model
        dispatcher's); ``command_sha256``: the digest of the message it came in."""
        self._refuse(deployment, reason, command_sha256=command_sha256)

    def _refuse(self, deployment: Deployment, reason: str, *, command_sha256: str | None = None) -> None:
        """Report a signed deployment we will not run, without touching the running one."""
        self._publish(
            OtaStatus(
                device_id=self.device_id,
                deployment_id=deployment.deployment_id,
                msg_id=uuid.uuid4().hex,
                ts=datetime.now(timezone.utc),
                state="FAILED",
                reason=f"refused: {reason}",
                model=self.target.running_model(),
                command_sha256=command_sha256,
            )
        )

    def _republish(self) -> None:
        self.machine._publish()  # noqa: SLF001 - same module family; reports the current truth

    def agent_event(self, name: str, detail: dict[str, Any]) -> None:
        if self.events is not None:
            self.events.emit(name, detail)

    def _publish(self, status: OtaStatus) -> None:
        log.info(
            "update %s: %s%s",
            status.deployment_id,
            status.state,
            f" ({status.reason})" if status.reason and status.progress is None else "",
        )
        if status.state in {s.value for s in RESTING_STATES} or status.progress is None:
            self.agent_event(
                "ota_state",
                {"deployment_id": status.deployment_id, "state": status.state, "reason": status.reason},
            )
        if self.link is not None:
            self.link.publish_reliable(OTA_STATUS, status)
