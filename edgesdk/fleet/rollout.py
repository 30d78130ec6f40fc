"""The staged rollout controller (operator side): canary, waves, failure threshold, abort.

A push is planned into waves (the canary first), written to the deployment database, then run:
each wave gets its own freshly issued, signed command (addressed to the wave's devices, with the
wave number, a short expiry and the next sequence of the operator key) on their topics, the controller serves their chunk
requests and records their statuses, and waits until every device of the wave has committed
(which a device only does after its probation) or failed, or the wave times out. As soon as the
failures among the devices sent so far exceed ``max_failures``, the rollout aborts and the
current wave is told to roll back; earlier waves keep the new model (they passed).

Everything is persisted before it is acted on, so ``run()`` on a deployment that is still
IN_PROGRESS (a restarted controller) picks up at its current wave, and ``fleet abort`` or
``fleet rollback`` from another shell is seen by a running controller at its next poll.
A decision that sends commands (abort → roll the wave back, operator abort or rollback) is
stored *with* the commands it owes, as a :class:`~edgesdk.fleet.deployments.FollowUp`, in the
same transaction as the new state; the follow-up is marked delivered only after it was
published, so a controller killed between the decision and the publish sends it on restart
(:meth:`RolloutController.deliver_follow_ups`). The store is a port (``RolloutStore``), with
one implementation (``SqlRolloutStore``): in the operator's SQLite file for ``fleet push``, in the
fleet service's database there.

Every wave has a deadline (``--wave-timeout``; by default probation + 10 minutes), counted
from the wave's first send (a resumed wave keeps it): a device with no final word by then is
TIMED_OUT ("no answer within 20m") and counts as failed for the wave's gate, so a rollout to a
device that never answers ends instead of waiting for ever.
``wave_progress`` is reported when a wave's counts change, not at every poll.

Refusals. Every command's digest is stored before it is sent. A device that refuses a signed
command answers FAILED with the digest; one whose signature does not verify (an operator key
the device does not trust, say) only sends a rate-limited ``ota_refused`` event with it. Both
reach the controller in seconds, and a refusal of a command it issued to that device fails the
device's part of the wave (``refused by DEVICE: …``), so ``fleet push`` ends with the reason
instead of waiting for the wave timeout. A refusal quoting any other digest is reported
(``refusal_ignored``) and changes nothing: a copy of a command with a junk signature, published
by someone else on the device's topic, cannot fail a rollout.
"""

from __future__ import annotations

import hashlib
import logging
import math
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from edgesdk.errors import EdgeSDKError, UsageError
from edgesdk.fleet.chunk_server import ChunkServer, RequestBudget
from edgesdk.fleet.deployments import (
    ABORTED,
    DEFAULT_COMMAND_TTL_S,
    DEVICE_FAILURE,
    DEVICE_SUCCESS,
    FINISHED_ROLLOUT_STATES,
    IN_PROGRESS,
    ROLLED_BACK,
    SUCCEEDED,
    DeviceRow,
    FollowUp,
    RefusalVerdict,
    RolloutStore,
    build_deployment,
    issue_command,
    judge_refusals,
)
from edgesdk.fleet.schedule import waiting_for
from edgesdk.protocol.signing import command_digest, command_payload
from edgesdk.protocol.topics import (
    EVENTS,
    OTA_DEPLOYMENT,
    OTA_STATUS,
    PRESENCE,
    all_devices_filter,
    device_topic,
    parse_topic,
)
from edgesdk.schemas.messages import Deployment, Event, HealthCriteria, OtaStatus, Presence

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, dict[str, Any]], None]
#: What ``run`` returns when the controller was stopped; the deployment stays IN_PROGRESS.
STOPPED = "STOPPED"


@dataclass(frozen=True)
class RolloutPlan:
    """How a deployment spreads: fractions of the target devices, cumulative."""

    canary: float = 0.10
    waves: tuple[float, ...] = (0.10, 0.50, 1.00)
    max_failures: float = 0.05
    probation_s: float = 600.0
    #: Every wave has a deadline: a device without a final word by then counts as failed for the
    #: wave's gate (TIMED_OUT, "no answer within …"). None: the default, probation + 10 minutes.
    wave_timeout_s: float | None = None
    resend_s: float = 30.0
    command_ttl_s: float = DEFAULT_COMMAND_TTL_S  # each issued command's lifetime (``--expires``)
    #: Scheduled start (Unix seconds, ``--start-at``): nothing is sent before it; state PENDING.
    start_at: float | None = None
    #: Maintenance window ``HH:MM-HH:MM`` (``--window``) in ``window_tz`` (else the service's
    #: default zone, ``edgesdk.fleet.schedule``): a wave starts, and commands are sent, only inside it.
    window: str | None = None
    window_tz: str | None = None

    def timeout(self) -> float:
        """The wave's deadline in seconds (``--wave-timeout``, else probation + 10 minutes)."""
        return self.wave_timeout_s if self.wave_timeout_s is not None else self.probation_s + 600.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutPlan:
        return cls(**{**data, "waves": tuple(data.get("waves", (1.0,)))})


_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%?\s*$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_percent(text: str, *, option: str) -> float:
    """``"10%"`` or ``"10"`` → 0.10; UsageError naming the option and value otherwise."""
    match = _PERCENT.match(text)
    value = float(match.group(1)) / 100.0 if match else -1.0
    if not 0.0 <= value <= 1.0:
        raise UsageError(f"bad {option} {text!r}: expected a percentage between 0% and 100%, e.g. 10%")
    return value


def parse_waves(text: str) -> tuple[float, ...]:
    """``"10%,50%,100%"`` → (0.1, 0.5, 1.0); must rise and end at 100%."""
    waves = tuple(parse_percent(part, option="--waves") for part in text.split(",") if part.strip())
    if not waves or list(waves) != sorted(waves) or waves[-1] != 1.0:
        raise UsageError(f"bad --waves {text!r}: expected rising percentages ending at 100%, e.g. 10%,50%,100%")
    return waves


def parse_duration(text: str, *, option: str) -> float:
    """``"10m"``, ``"30s"``, ``"1h"``, ``"7d"``, ``"250ms"``, ``"90"`` (seconds) → seconds."""
    match = _DURATION.match(text)
    if not match:
        raise UsageError(f"bad {option} {text!r}: expected a duration like 30s, 10m, 1h or 7d")
    scale = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}[match.group(2)]
    return float(match.group(1)) * scale


def format_duration(seconds: float) -> str:
    """``1200`` → ``"20m"``, ``90`` → ``"90s"``, ``7200`` → ``"2h"`` (what ``parse_duration`` reads)."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def plan_waves(devices: list[str], plan: RolloutPlan, *, seed: str) -> list[list[str]]:
    """Split ``devices`` into the canary and the waves. The order is a hash of the deployment
    id, so each rollout picks a different canary but a resumed one picks the same."""
    ordered = sorted(dict.fromkeys(devices), key=lambda d: hashlib.sha256(f"{seed}/{d}".encode()).hexdigest())
    total = len(ordered)
    cuts: list[int] = []
    if plan.canary > 0 and total > 1:
        cuts.append(max(1, math.ceil(plan.canary * total)))
    cuts += [math.ceil(f * total) for f in plan.waves]
    waves: list[list[str]] = []
    start = 0
    for cut in cuts:
        cut = min(max(cut, start), total)
        if cut > start:
            waves.append(ordered[start:cut])
            start = cut
    if start < total:
        waves.append(ordered[start:])
    return waves


def create_deployment(
    store: RolloutStore,
    bundle: Path,
    devices: list[str],
    plan: RolloutPlan,
    *,
    deployment_id: str | None = None,
    artifact_urls: list[str] | tuple[str, ...] = (),
    mqtt_fallback: bool = True,
    chunk_size: int | None = None,
    health: HealthCriteria | None = None,
) -> Deployment:
    """Make the deployment's template, plan its waves, persist both (state PENDING); the
    commands devices act on are issued per wave by ``RolloutController.run``."""
    if not devices:
        raise UsageError("no target devices: give --devices A,B or a --group with members")
    deployment_id = deployment_id or f"dep-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    health = health or HealthCriteria(probation_s=plan.probation_s)
    kwargs: dict[str, Any] = {"chunk_size": chunk_size} if chunk_size else {}
    message = build_deployment(
        bundle,
        deployment_id=deployment_id,
        targets=devices,
        health=health,
        artifact_urls=artifact_urls,
        mqtt_fallback=mqtt_fallback,
        command_ttl_s=plan.command_ttl_s,
        **kwargs,
    )
    waves = plan_waves(devices, plan, seed=deployment_id)
    store.create(message, bundle, plan.to_json(), waves)
    return message


class RolloutController:
    """Runs deployments over one MQTT client (from edgesdk.mqtt.client)."""

    def __init__(
        self,
        store: RolloutStore,
        client: Any,
        namespace: str,
        operator_key: Any,
        *,
        on_progress: ProgressFn | None = None,
        poll_s: float = 0.2,
        chunk_budget: RequestBudget | None = None,
        artifact_base_url: str | None = None,
    ) -> None:
        self.store = store
        #: Where this controller's bundles are also served over HTTP (the fleet service's
        #: ``/artifacts/``); each install command then lists ``BASE/<sha256>.edgepkg`` after the
        #: deployment's own URLs. None: only the URLs the deployment was created with.
        self.artifact_base_url = artifact_base_url
        self.client = client
        self.namespace = namespace
        self.operator_key = operator_key
        self.on_progress = on_progress or (lambda _event, _info: None)
        self.poll_s = poll_s
        self.chunks = ChunkServer(
            namespace, lambda topic, payload, qos: client.publish(topic, payload, qos=qos), budget=chunk_budget
        )
        self._statuses: queue.Queue[bytes] = queue.Queue()
        self._refusal_events: queue.Queue[Event] = queue.Queue()
        self._presence: dict[str, Presence] = {}
        self._presence_lock = threading.Lock()
        self._status_filter = all_devices_filter(namespace, OTA_STATUS)
        self._events_filter = all_devices_filter(namespace, EVENTS)
        self._presence_filter = all_devices_filter(namespace, PRESENCE)
        self._stopping = threading.Event()

    # -- wiring -------------------------------------------------------------------------------

    def start(self) -> RolloutController:
        """Subscribe to statuses, events (for refusals), chunk requests and presence; call before ``run``."""
        self.client.on_message = self.handle_message
        self.client.subscribe(self._status_filter, qos=1)
        self.client.subscribe(self._events_filter, qos=1)
        self.client.subscribe(self.chunks.request_filter, qos=0)
        self.client.subscribe(self._presence_filter, qos=0)
        return self

    def handle_message(self, topic: str, payload: bytes) -> None:
        """One MQTT message (statuses are queued for the controller thread, chunk requests
        served, presence kept); a service that owns the client dispatches to this."""
        parsed = parse_topic(self.namespace, topic)
        if parsed is None or parsed.scope != "devices":
            return
        if parsed.suffix == OTA_STATUS:
            self._statuses.put(payload)  # SQLite work happens on the controller thread
        elif parsed.suffix == EVENTS:
            if b"ota_refused" not in payload:
                return  # the rest of a device's events are the fleet service's business
            try:
                event = Event.model_validate_json(payload)
            except ValueError:
                return
            if event.device_id == parsed.name and event.event == "ota_refused":
                self._refusal_events.put(event)
        elif parsed.suffix == self.chunks.request_filter.rsplit("/+/", 1)[1]:
            self.chunks.on_message(topic, payload)
        elif parsed.suffix == PRESENCE:
            try:
                presence = Presence.model_validate_json(payload)
            except ValueError:
                return
            with self._presence_lock:
                self._presence[presence.device_id] = presence

    def devices_in_group(self, group: str, *, wait_s: float = 2.0) -> list[str]:
        """Devices whose retained presence lists ``group`` (online or not: offline ones get
        the deployment when they return, through their persistent session)."""
        time.sleep(wait_s)  # retained presence arrives right after subscribing
        with self._presence_lock:
            found = sorted(d for d, p in self._presence.items() if group in p.groups)
        if not found:
            raise UsageError(f"no device of group {group!r} has announced itself on this broker")
        return found

    def stop(self) -> None:
        """Leave ``run`` at its next poll with the deployment still IN_PROGRESS (resumable)."""
        self._stopping.set()

    # -- creating -----------------------------------------------------------------------------

    def create(
        self,
        bundle: Path,
        devices: list[str],
        plan: RolloutPlan,
        *,
        deployment_id: str | None = None,
        artifact_urls: list[str] | tuple[str, ...] = (),
        mqtt_fallback: bool = True,
        chunk_size: int | None = None,
        health: HealthCriteria | None = None,
    ) -> Deployment:
        """See :func:`create_deployment` (in this controller's store)."""
        return create_deployment(
            self.store,
            bundle,
            devices,
            plan,
            deployment_id=deployment_id,
            artifact_urls=artifact_urls,
            mqtt_fallback=mqtt_fallback,
            chunk_size=chunk_size,
            health=health,
        )

    # -- running ------------------------------------------------------------------------------

    def run(self, deployment_id: str) -> str:
        """Run (or resume) a deployment until it succeeds, aborts or is rolled back."""
        self.deliver_follow_ups(deployment_id)  # commands a killed controller decided but did not send
        row = self.store.get(deployment_id)
        if row.state in FINISHED_ROLLOUT_STATES:
            return row.state
        plan = RolloutPlan.from_json(row.plan)
        message = self._with_own_artifact_url(row.message)
        self.chunks.add(Path(row.bundle_path), message)
        try:
            total = len(self.store.devices(deployment_id))
            waves = self.store.wave_count(deployment_id)
            first = max(row.wave, 0)
            held = self._wait_until_open(deployment_id, plan, row.state, first)
            if held is not None:
                return held
            self.store.set_state(deployment_id, IN_PROGRESS, wave=first)
            for wave in range(first, waves):
                outcome = self._run_wave(deployment_id, message, plan, wave, waves, total)
                if outcome != "passed":
                    return outcome
                if wave + 1 < waves:
                    self.store.set_state(deployment_id, IN_PROGRESS, wave=wave + 1)
            self.store.set_state(deployment_id, SUCCEEDED, reason="every wave committed")
            self.on_progress("finished", {"deployment_id": deployment_id, "state": SUCCEEDED})
            return SUCCEEDED
        finally:
            self._drain_statuses()
            self.chunks.remove(deployment_id)

    def _with_own_artifact_url(self, template: Deployment) -> Deployment:
        if self.artifact_base_url is None:
            return template
        own = f"{self.artifact_base_url.rstrip('/')}/{template.bundle_sha256}.edgepkg"
        if own in template.artifact_urls or len(template.artifact_urls) >= 8:
            return template
        return template.model_copy(update={"artifact_urls": [*template.artifact_urls, own]})

    def _run_wave(
        self, deployment_id: str, message: Deployment, plan: RolloutPlan, wave: int, waves: int, total: int
    ) -> str:
        devices = [d.device_id for d in self.store.devices(deployment_id, wave)]
        self.on_progress(
            "wave_started", {"deployment_id": deployment_id, "wave": wave, "waves": waves, "devices": len(devices)}
        )
        # Every device of the wave without a final word: on a fresh wave that is all of them;
        # on a resumed one it includes devices mid-update, which treat the command as a repeat
        # of their deployment and re-report their state (one lost while we were down included).
        pending = [
            d.device_id
            for d in self.store.devices(deployment_id, wave)
            if d.state not in DEVICE_SUCCESS and d.state not in DEVICE_FAILURE
        ]
        # Issued now, for this wave only: a wave that starts after the canary's probation gets a
        # command dated now, and the canary's message is not valid for anyone else.
        if self._wave_age(deployment_id, wave) == 0.0:  # a fresh wave starts inside the window only
            held = self._wait_until_open(deployment_id, plan, IN_PROGRESS, wave)
            if held is not None:
                return held
        command = self.issue(message, devices, wave=wave, ttl_s=plan.command_ttl_s)
        self._send(command, pending)
        self.store.mark_sent(deployment_id, pending)
        self.on_progress(
            "wave_sent",
            {"deployment_id": deployment_id, "wave": wave, "devices": len(pending), "deadline_s": plan.timeout()},
        )
        return self._watch_wave(deployment_id, message, plan, wave, devices, command)

    def _watch_wave(
        self,
        deployment_id: str,
        message: Deployment,
        plan: RolloutPlan,
        wave: int,
        devices: list[str],
        command: Deployment,
    ) -> str:
        """Poll the wave until every device has a final word ("passed"), the failures pass the
        threshold (ABORTED), the deployment ends elsewhere or the controller stops; silent
        devices are sent the command again meanwhile and time out at the wave's deadline."""
        deadline = time.monotonic() + plan.timeout() - self._wave_age(deployment_id, wave)
        last_sent = time.monotonic()
        last_progress: dict[str, Any] | None = None
        while True:
            self._drain_statuses()
            row = self.store.get(deployment_id)
            if row.state in FINISHED_ROLLOUT_STATES:  # aborted/rolled back from another shell
                self.on_progress("finished", {"deployment_id": deployment_id, "state": row.state, "reason": row.reason})
                return row.state
            if self._stopping.is_set():
                return STOPPED
            tally = _WaveTally.of(self.store.devices(deployment_id), wave)
            progress = tally.progress(deployment_id, wave)
            if progress != last_progress:  # a poll that changed nothing is no news (fleet status has it)
                self.on_progress("wave_progress", progress)
                last_progress = progress
            else:
                log.debug("rollout wave_progress %s (unchanged)", progress)
            verdict = self._judge_wave(deployment_id, message, plan, wave, tally)
            if verdict is not None:
                return verdict
            now = time.monotonic()
            if now > deadline:
                self._time_out_silent(deployment_id, plan, tally)
                continue  # judged again with the timeouts counted as failures
            if now - last_sent > plan.resend_s and self._may_send(plan):
                # A device that never answered may have been offline: send again (devices ignore repeats).
                silent = [d.device_id for d in tally.in_wave if d.state == "SENT"]
                if command.expires_at is None or command.expires_at - _utcnow() < _seconds(2 * plan.resend_s):
                    command = self.issue(message, devices, wave=wave, ttl_s=plan.command_ttl_s)
                self._send(command, silent)  # the same command again is a repeat to a device that has it
                last_sent = now
            time.sleep(self.poll_s)

    def _judge_wave(
        self, deployment_id: str, message: Deployment, plan: RolloutPlan, wave: int, tally: _WaveTally
    ) -> str | None:
        """ABORTED (the wave aborted) when the failures so far pass max_failures; "passed" when
        every device of the wave has a final word; None while it runs."""
        if len(tally.failures) > plan.max_failures * len(tally.sent):
            failures, sent = tally.failures, tally.sent
            reason = (
                f"{len(failures)} of {len(sent)} devices failed in waves 0..{wave} "
                f"(max_failures {plan.max_failures:.0%}); first: {failures[0].device_id}: {failures[0].reason}"
            )
            self._abort_wave(deployment_id, message, plan, wave, reason)
            return ABORTED
        if len(tally.done) == len(tally.in_wave):
            self.on_progress(
                "wave_done",
                {
                    "deployment_id": deployment_id,
                    "wave": wave,
                    "failed": len([d for d in tally.in_wave if d.state in DEVICE_FAILURE]),
                },
            )
            return "passed"
        return None

    def _time_out_silent(self, deployment_id: str, plan: RolloutPlan, tally: _WaveTally) -> None:
        """Past the wave's deadline: every device of the wave without a final word TIMED_OUT."""
        for device in tally.in_wave:
            if device not in tally.done:
                self.store.set_device_state(
                    deployment_id,
                    device.device_id,
                    "TIMED_OUT",
                    f"no answer within {format_duration(plan.timeout())} (last {device.state})",
                )

    def _wait_until_open(self, deployment_id: str, plan: RolloutPlan, state: str, wave: int) -> str | None:
        """Wait for the plan's start and window, the reason shown in the deployment's status;
        None when it may send, or the state to return (ended from elsewhere, or STOPPED)."""
        shown = None
        while True:
            why = waiting_for(time.time(), plan.start_at, plan.window, plan.window_tz)
            if why is None:
                if shown is not None:
                    self.store.set_state(deployment_id, state, wave=wave, reason="")
                return None
            if why != shown:  # the "opens in" countdown changes once a minute
                if shown is None or why.split(" (")[0] != shown.split(" (")[0]:
                    self.on_progress("waiting", {"deployment_id": deployment_id, "wave": wave, "reason": why})
                self.store.set_state(deployment_id, state, wave=wave, reason=why)
                shown = why
            row = self.store.get(deployment_id)
            if row.state in FINISHED_ROLLOUT_STATES:
                return row.state
            if self._stopping.wait(max(self.poll_s, 0.05)):
                return STOPPED

    @staticmethod
    def _may_send(plan: RolloutPlan) -> bool:
        return plan.window is None or waiting_for(time.time(), None, plan.window, plan.window_tz) is None

    def _wave_age(self, deployment_id: str, wave: int) -> float:
        """Seconds since the wave's command was first sent: a resumed wave (a restarted service
        or ``fleet push --deployment-id``) keeps its deadline instead of starting a new one."""
        sent = [d.sent for d in self.store.devices(deployment_id, wave) if d.sent is not None]
        return max(0.0, time.time() - min(sent)) if sent else 0.0

    def _abort_wave(self, deployment_id: str, message: Deployment, plan: RolloutPlan, wave: int, reason: str) -> None:
        """Stop the rollout and roll the failing wave back (earlier waves passed and stay)."""
        in_wave = [d.device_id for d in self.store.devices(deployment_id, wave) if d.state not in ("PENDING",)]
        follow_up = FollowUp.owed(deployment_id, "rollback", in_wave, wave=wave, ttl_s=plan.command_ttl_s)
        self.store.set_state(deployment_id, ABORTED, reason=reason, follow_up=follow_up)
        log.warning("deployment %s aborted: %s", deployment_id, reason)
        self.on_progress("abort_decided", {"deployment_id": deployment_id, "wave": wave, "reason": reason})
        self.deliver_follow_ups(deployment_id)
        self.on_progress("aborted", {"deployment_id": deployment_id, "wave": wave, "reason": reason})

    def abort(self, deployment_id: str, reason: str = "aborted by operator", *, ttl_s: float | None = None) -> None:
        """Stop a rollout: no further waves; devices still updating cancel (and roll back if activated)."""
        row = self.store.get(deployment_id)
        active = [
            d.device_id
            for d in self.store.devices(deployment_id)
            if d.state not in ("PENDING",) and d.state not in DEVICE_SUCCESS
        ]
        plan = _with_ttl(RolloutPlan.from_json(row.plan), ttl_s)
        follow_up = FollowUp.owed(deployment_id, "cancel", active, ttl_s=plan.command_ttl_s)
        self.store.set_state(deployment_id, ABORTED, reason=reason, follow_up=follow_up)
        self.deliver_follow_ups(deployment_id)

    def rollback(
        self, deployment_id: str, reason: str = "rolled back by operator", *, ttl_s: float | None = None
    ) -> int:
        """Roll every device the deployment reached back to its previous model; returns how many were asked."""
        row = self.store.get(deployment_id)
        reached = [d.device_id for d in self.store.devices(deployment_id) if d.state != "PENDING"]
        plan = _with_ttl(RolloutPlan.from_json(row.plan), ttl_s)
        follow_up = FollowUp.owed(deployment_id, "rollback", reached, ttl_s=plan.command_ttl_s)
        self.store.set_state(deployment_id, ROLLED_BACK, reason=reason, follow_up=follow_up)
        self.deliver_follow_ups(deployment_id)
        return len(reached)

    def deliver_follow_ups(self, deployment_id: str | None = None) -> int:
        """Publish the commands decided but not yet marked delivered (all deployments, or one),
        each freshly issued; returns how many were sent. Devices that already acted on an
        earlier copy treat it as a repeat of their deployment."""
        sent = 0
        for follow_up in self.store.pending_follow_ups(deployment_id):
            template = self.store.get(follow_up.deployment_id).message
            if follow_up.devices:
                command = self.issue(
                    template,
                    list(follow_up.devices),
                    action=follow_up.action,
                    wave=follow_up.wave,
                    ttl_s=follow_up.ttl_s,
                )
                self._send(command, list(follow_up.devices))
            self.store.follow_up_delivered(follow_up.follow_up_id)
            self.on_progress(
                "follow_up_sent",
                {
                    "deployment_id": follow_up.deployment_id,
                    "action": follow_up.action,
                    "devices": len(follow_up.devices),
                },
            )
            sent += 1
        return sent

    def wait_for_states(self, deployment_id: str, states: set[str], timeout: float) -> bool:
        """Record statuses until every reached device is in one of ``states`` (tests, CLI)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._drain_statuses()
            rows = [d for d in self.store.devices(deployment_id) if d.state != "PENDING"]
            if all(d.state in states for d in rows):
                return True
            time.sleep(self.poll_s)
        return False

    # -- plumbing -----------------------------------------------------------------------------

    def issue(
        self,
        template: Deployment,
        devices: list[str],
        *,
        action: str = "install",
        wave: int | None = None,
        ttl_s: float = DEFAULT_COMMAND_TTL_S,
    ) -> Deployment:
        """A fresh signed command from ``template`` for exactly ``devices`` (see issue_command),
        its digest stored before anyone can send it (a refusal of it then counts)."""
        command = issue_command(
            template,
            store=self.store,
            operator_key=self.operator_key,
            targets=devices,
            action=action,
            wave=wave,
            ttl_s=ttl_s,
        )
        self.store.record_issued(command_digest(command_payload(command)), command)
        return command

    def _send(self, message: Deployment, devices: list[str]) -> None:
        payload = command_payload(message)  # the bytes whose digest issue() stored
        for device in devices:
            try:
                self.client.publish(device_topic(self.namespace, device, OTA_DEPLOYMENT), payload, qos=1)
            except EdgeSDKError as exc:
                log.warning("deployment to %s not sent now (%s); will resend", device, exc)

    def _drain_statuses(self) -> None:
        """Record the statuses and judge the refusals that arrived (on the controller thread)."""
        statuses: list[OtaStatus] = []
        while True:
            try:
                payload = self._statuses.get_nowait()
            except queue.Empty:
                break
            try:
                statuses.append(OtaStatus.model_validate_json(payload))
            except ValueError as exc:
                log.warning("ignored malformed status: %s", exc)
        for status in statuses:
            if status.command_sha256 is None:
                self.store.record_status(status)
        events: list[Event] = []
        while True:
            try:
                events.append(self._refusal_events.get_nowait())
            except queue.Empty:
                break
        for refusal, verdict in judge_refusals(self.store, statuses, events):
            self._refusal_seen(refusal.device_id, refusal.command_sha256, refusal.reason, verdict)

    def _refusal_seen(self, device_id: str, digest: str, reason: str, verdict: RefusalVerdict) -> None:
        info = {"device_id": device_id, "command_sha256": digest, "reason": reason.removeprefix("refused: ")}
        if verdict.counted:
            log.warning("deployment %s: refused by %s: %s", verdict.deployment_id, device_id, info["reason"])
            self.on_progress("refused", {**info, "deployment_id": verdict.deployment_id})
        else:
            log.warning(
                "%s refused a command this controller did not issue to it (%s, digest %s): %s",
                device_id,
                verdict.security_event,
                digest[:12],
                info["reason"],
            )
            self.on_progress("refusal_ignored", {**info, "kind": verdict.security_event})


def _with_ttl(plan: RolloutPlan, ttl_s: float | None) -> RolloutPlan:
    """``plan`` with its command lifetime replaced (``fleet abort/rollback --expires``)."""
    return plan if ttl_s is None else RolloutPlan.from_json({**plan.to_json(), "command_ttl_s": ttl_s})


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


@dataclass(frozen=True)
class _WaveTally:
    """One poll of a deployment's devices, as a wave sees it."""

    #: Devices of this wave and the ones before it (the failure threshold counts them all).
    sent: list[DeviceRow]
    failures: list[DeviceRow]
    in_wave: list[DeviceRow]
    #: Devices of this wave with a final word (success or failure).
    done: list[DeviceRow]

    @classmethod
    def of(cls, rows: list[DeviceRow], wave: int) -> _WaveTally:
        sent = [d for d in rows if d.wave <= wave]
        in_wave = [d for d in rows if d.wave == wave]
        return cls(
            sent=sent,
            failures=[d for d in sent if d.state in DEVICE_FAILURE],
            in_wave=in_wave,
            done=[d for d in in_wave if d.state in DEVICE_SUCCESS or d.state in DEVICE_FAILURE],
        )

    def progress(self, deployment_id: str, wave: int) -> dict[str, Any]:
        """The wave_progress event's payload."""
        return {
            "deployment_id": deployment_id,
            "wave": wave,
            "done": len(self.done),
            "devices": len(self.in_wave),
            "failed": len([d for d in self.in_wave if d.state in DEVICE_FAILURE]),
            "states": _count(d.state for d in self.in_wave),
        }


def _count(states: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return counts
