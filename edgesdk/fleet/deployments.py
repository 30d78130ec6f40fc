"""The deployment domain model: rollout and device states, the signed command, refusals, the store port.

There is one deployment store, :class:`edgesdk.fleet.service.store.SqlRolloutStore` (SQLAlchemy
Core): the fleet service keeps it in PostgreSQL or SQLite, and the standalone ``edgesdk fleet
push`` in one SQLite file (:func:`edgesdk.fleet.service.operator_db.open_rollout_store`, at
:func:`default_db_path`). This module holds what both sides share and import: the states, the
rows, :class:`RolloutStore` (the port the rollout controller persists through), how a command is
issued, and how a device's refusal is judged.

What the database keeps of a deployment is its *template*: the bundle's fields, unsigned,
sequence 0 — not a command any device accepts. Every message that leaves for devices is
issued from it by :func:`issue_command`: freshly dated, expiring after the plan's command TTL,
addressed to exactly the devices (and wave) it is sent to, carrying the next sequence number
of the signing key (persisted by the store), and signed. A wave that starts hours after the
canary therefore gets its own command, and a captured one is useless elsewhere and later.

Every issued command's digest (the sha256 of the message as published) is kept with its
deployment, action and targets (``issued_commands``), before it is sent. A device that refuses a
command quotes that digest; the refusal counts toward a rollout only when it is of a command
issued here *to that device* (and, for an install, before the device reported any work on the
deployment) — :func:`judge_refusal`. Anything else (a forged or replayed copy someone else
published on the device's topic) changes no rollout; the fleet service records it as a
security event. :func:`judge_refusals` is the one place that picks the refusals out of what
devices sent and has the store judge them: the rollout controller and the service's ingest
both call it.

The rollout controller writes every decision and every device status to the store before
acting on it, so a controller that is stopped or crashes is resumed from the database (``fleet
push --deployment-id ID`` again), and ``fleet status/abort/rollback`` work from another shell
while a rollout runs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from edgesdk.errors import UsageError
from edgesdk.protocol.chunks import DEFAULT_CHUNK_SIZE, chunk_hashes
from edgesdk.protocol.signing import sign_deployment
from edgesdk.schemas.messages import CommandRefusal, Deployment, Event, HealthCriteria, OtaStatus, RefusalKind

#: Rollout states of a whole deployment.
PENDING, IN_PROGRESS, SUCCEEDED, ABORTED, ROLLED_BACK = "PENDING", "IN_PROGRESS", "SUCCEEDED", "ABORTED", "ROLLED_BACK"
FINISHED_ROLLOUT_STATES = frozenset({SUCCEEDED, ABORTED, ROLLED_BACK})
#: Device states that end a device's part of a wave.
DEVICE_SUCCESS = frozenset({"COMMITTED"})
DEVICE_FAILURE = frozenset({"FAILED", "ROLLED_BACK", "TIMED_OUT"})

DEFAULT_DB_ENV = "EDGESDK_FLEET_DB"


def default_db_path() -> Path:
    """``$EDGESDK_FLEET_DB``, else ``~/.local/share/edgesdk/fleet.sqlite3``."""
    env = os.environ.get(DEFAULT_DB_ENV)
    if env:
        return Path(env)
    return Path.home() / ".local" / "share" / "edgesdk" / "fleet.sqlite3"


#: How long an issued command stays valid when the plan does not say (``--expires``).
DEFAULT_COMMAND_TTL_S = 6 * 3600.0


def build_deployment(
    bundle: Path,
    *,
    deployment_id: str,
    targets: list[str],
    health: HealthCriteria,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    artifact_urls: list[str] | tuple[str, ...] = (),
    mqtt_fallback: bool = True,
    command_ttl_s: float = DEFAULT_COMMAND_TTL_S,
) -> Deployment:
    """The unsigned install template for ``bundle`` to ``targets`` (manifest read for display
    fields only: the device verifies the bundle itself). ``artifact_urls``: HTTP(S) sources
    devices try first, in order (signed with the rest; the hashes are what devices trust). Send only what :func:`issue_command`
    makes of it."""
    from edgesdk.bundle import inspect_bundle

    if not bundle.is_file():
        raise UsageError(f"bundle file {str(bundle)!r} not found")
    model = inspect_bundle(bundle).manifest.model
    digest = hashlib.sha256()
    with open(bundle, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    now = datetime.now(timezone.utc)
    return Deployment(
        deployment_id=deployment_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=command_ttl_s),
        sequence=0,
        targets=sorted(targets),
        model_name=model.name,
        model_version=model.version,
        release=model.release,
        bundle_sha256=digest.hexdigest(),
        bundle_size=bundle.stat().st_size,
        chunk_size=chunk_size,
        # Always: HTTP downloads check (and resume by) chunk too, and may fall back to MQTT.
        chunk_sha256=chunk_hashes(bundle, chunk_size),
        artifact_urls=list(artifact_urls),
        mqtt_fallback=mqtt_fallback,
        health=health,
    )


def issue_command(
    template: Deployment,
    *,
    store: SequenceSource,
    operator_key: Any,
    targets: list[str],
    action: str = "install",
    wave: int | None = None,
    ttl_s: float = DEFAULT_COMMAND_TTL_S,
    target_groups: list[str] | None = None,
) -> Deployment:
    """A command made from ``template``: ``action`` for exactly ``targets`` (and/or
    ``target_groups``), issued now, expiring in ``ttl_s``, with the signing key's next sequence."""
    from edgesdk.keys import key_id

    if not targets and not target_groups:
        raise UsageError(f"deployment {template.deployment_id!r}: a command needs target devices or groups")
    if ttl_s <= 0:
        raise UsageError(f"command lifetime must be positive, got {ttl_s:g} s")
    now = datetime.now(timezone.utc)
    command = template.model_copy(
        update={
            "action": action,
            "issued_at": now,
            "expires_at": now + timedelta(seconds=ttl_s),
            "sequence": store.next_sequence(key_id(operator_key.public_key())),
            "targets": sorted(targets),
            "target_groups": sorted(target_groups or []),
            "wave": wave,
            "signature": None,
        }
    )
    # model_copy skips validation: validate the command as a device will, before signing it.
    return sign_deployment(Deployment.model_validate(command.model_dump()), operator_key)


class SequenceSource(Protocol):
    """Where command sequence numbers come from (persisted before they are used)."""

    def next_sequence(self, issuer: str) -> int: ...


@dataclass(frozen=True)
class FollowUp:
    """Commands a rollout decision owes to devices (cancel or roll back), stored in the same
    transaction as the decision and marked delivered once published."""

    deployment_id: str
    action: str
    devices: tuple[str, ...]
    wave: int | None
    ttl_s: float
    follow_up_id: int = 0  # set by the store

    @classmethod
    def owed(
        cls, deployment_id: str, action: str, devices: list[str], *, wave: int | None = None, ttl_s: float
    ) -> FollowUp:
        return cls(deployment_id, action, tuple(sorted(devices)), wave, ttl_s)


@dataclass(frozen=True)
class DeviceRow:
    deployment_id: str
    device_id: str
    wave: int
    state: str
    reason: str
    progress: float | None
    model_release: int | None
    updated: float | None
    sent: float | None = None  # when the device was first sent its wave's command (the deadline counts from it)


@dataclass(frozen=True)
class DeploymentRow:
    id: str
    created: float
    updated: float
    bundle_path: str
    message: Deployment
    plan: dict[str, Any]
    state: str
    wave: int
    reason: str


@dataclass(frozen=True)
class IssuedCommand:
    """What the store keeps of a command it issued: enough to judge a refusal of it."""

    digest: str
    deployment_id: str
    action: str
    targets: tuple[str, ...]


#: Refusal kinds a device reports with an ``ota_refused`` event and no status (the message proved
#: no sender); the others come as a FAILED status carrying the digest (and an event beside it).
UNVERIFIED_REFUSALS: frozenset[RefusalKind] = frozenset(
    {"malformed", "unsigned", "malformed_signature", "unknown_key", "bad_signature"}
)
#: Security events: a refusal of a command not issued here to that device, or of an install
#: command of a deployment the device already reported working on (a replayed copy).
REFUSAL_OF_UNISSUED, REFUSAL_OF_SUPERSEDED = "refusal_of_unissued_command", "refusal_of_superseded_command"


@dataclass(frozen=True)
class RefusalVerdict:
    """What a store made of a device's refusal: ``counted`` (the device's row of
    ``deployment_id`` is now FAILED with the reason) or ``security_event`` (its kind)."""

    counted: bool
    deployment_id: str | None = None
    security_event: str | None = None


def judge_refusal(
    issued: IssuedCommand | None, device_id: str, row: tuple[str, str | None] | None, ts: str
) -> RefusalVerdict:
    """Whether ``device_id``'s refusal (at ``ts``) of the command ``issued`` (None: not issued
    here) counts toward its rollout; ``row`` is the device's (state, status_ts) in that deployment."""
    if issued is None or device_id not in issued.targets or row is None:
        return RefusalVerdict(False, issued.deployment_id if issued else None, REFUSAL_OF_UNISSUED)
    state, status_ts = row
    if state == "FAILED" and status_ts == ts:
        return RefusalVerdict(True, issued.deployment_id)  # the same refusal again (QoS 1 redelivery)
    if issued.action == "install" and state not in ("PENDING", "SENT"):
        # The device already reported working on this deployment: a refusal of a copy of one of
        # its install commands is someone replaying it, not news about the update.
        return RefusalVerdict(False, issued.deployment_id, REFUSAL_OF_SUPERSEDED)
    return RefusalVerdict(True, issued.deployment_id)


def refusal_reason(device_id: str, reason: str) -> str:
    """The device row's reason for a counted refusal (``fleet push``, the dashboard)."""
    text = reason.removeprefix("refused: ")
    return f"refused by {device_id}: {text}"


@dataclass(frozen=True)
class Refusal:
    """A device's refusal of a command, as it arrived: in a FAILED status (a signed command it
    would not run) or an ``ota_refused`` event (a command whose signature did not verify)."""

    device_id: str
    command_sha256: str
    reason: str
    ts: datetime
    msg_id: str
    claimed_deployment: str | None  # what the message says; only the digest is trusted
    why: RefusalKind | None  # the event's kind; None for a status


def refusal_in_status(status: OtaStatus) -> Refusal | None:
    """The refusal a status carries (its ``command_sha256``), else None (an ordinary status)."""
    if status.command_sha256 is None:
        return None
    return Refusal(status.device_id, status.command_sha256, status.reason, status.ts, status.msg_id,
                   status.deployment_id, None)  # fmt: skip


def refusal_in_event(event: Event) -> Refusal | None:
    """The refusal of an unverified command an ``ota_refused`` event reports, else None: other
    events, an older agent's event without the digest, and a signed command's refusal (its
    FAILED status carries it, so counting the event too would judge it twice)."""
    if event.event != "ota_refused":
        return None
    try:
        refusal = CommandRefusal.model_validate(event.detail)
    except ValueError:
        return None
    if refusal.why not in UNVERIFIED_REFUSALS:
        return None
    return Refusal(event.device_id, refusal.command_sha256, f"refused: {refusal.reason}", event.ts, event.msg_id,
                   refusal.deployment_id, refusal.why)  # fmt: skip


def judge_refusals(
    store: RolloutStore, statuses: Iterable[OtaStatus], events: Iterable[Event]
) -> list[tuple[Refusal, RefusalVerdict]]:
    """Every refusal among ``statuses`` and ``events``, judged by ``store`` (which marks a counted
    one's device FAILED): the one path of a refusal, for the rollout controller and the fleet
    service's ingest alike. Statuses without a digest are not looked at (record them as usual)."""
    found = [r for r in map(refusal_in_status, statuses) if r is not None]
    found += [r for r in map(refusal_in_event, events) if r is not None]
    return [(r, store.record_refusal(r.device_id, r.command_sha256, r.reason, r.ts)) for r in found]


class RolloutStore(SequenceSource, Protocol):
    """The port the rollout controller persists through, implemented by the one store,
    :class:`edgesdk.fleet.service.store.SqlRolloutStore` (the operator's SQLite file or the
    fleet service's database); unit tests may put a fake behind it."""

    def create(self, message: Deployment, bundle_path: Path, plan: dict[str, Any], waves: list[list[str]]) -> None: ...
    def get(self, deployment_id: str) -> DeploymentRow: ...
    def all(self) -> list[DeploymentRow]: ...
    def set_state(
        self,
        deployment_id: str,
        state: str,
        *,
        reason: str | None = None,
        wave: int | None = None,
        follow_up: FollowUp | None = None,
    ) -> None: ...
    def pending_follow_ups(self, deployment_id: str | None = None) -> list[FollowUp]: ...
    def follow_up_delivered(self, follow_up_id: int) -> None: ...
    def devices(self, deployment_id: str, wave: int | None = None) -> list[DeviceRow]: ...
    def wave_count(self, deployment_id: str) -> int: ...
    def mark_sent(self, deployment_id: str, device_ids: list[str]) -> None: ...
    def set_device_state(self, deployment_id: str, device_id: str, state: str, reason: str) -> None: ...
    def record_status(self, status: OtaStatus) -> bool: ...
    def record_issued(self, digest: str, command: Deployment) -> None: ...
    def record_refusal(self, device_id: str, command_sha256: str, reason: str, ts: datetime) -> RefusalVerdict: ...
    def summary(self, deployment_id: str) -> dict[str, Any]: ...


def status_applies(current_state: str, current_status_ts: str | None, status: OtaStatus) -> bool:
    """Whether ``status`` replaces what is stored for its device: not older than the stored one
    (QoS 1 may redeliver and reorder), and a late progress tick never hides a later state."""
    if current_status_ts is not None and current_status_ts > status.ts.isoformat():
        return False
    return not (status.progress is not None and current_state not in ("PENDING", "SENT", "DOWNLOADING"))


def summarize(row: DeploymentRow, devices: list[DeviceRow]) -> dict[str, Any]:
    """Counts by device state, per wave and overall (for ``fleet status`` and the service API)."""
    by_state: dict[str, int] = {}
    waves: dict[int, dict[str, int]] = {}
    for device in devices:
        by_state[device.state] = by_state.get(device.state, 0) + 1
        wave = waves.setdefault(device.wave, {})
        wave[device.state] = wave.get(device.state, 0) + 1
    return {
        "deployment_id": row.id,
        "state": row.state,
        "reason": row.reason,
        "wave": row.wave,
        "model": f"{row.message.model_name} {row.message.model_version} (release {row.message.release})",
        "model_name": row.message.model_name,  # a device may serve several models, each its own rollouts
        "bundle": row.bundle_path,
        "devices": len(devices),
        "by_state": by_state,
        "waves": {str(k): v for k, v in sorted(waves.items())},
        "plan": row.plan,
        "created": datetime.fromtimestamp(row.created, timezone.utc).isoformat(),
        "updated": datetime.fromtimestamp(row.updated, timezone.utc).isoformat(),
    }
