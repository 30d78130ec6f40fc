"""Operator-side deployment records (SQLite) and signed Deployment messages.

What the database keeps of a deployment is its *template*: the bundle's fields, unsigned,
sequence 0 — not a command any device accepts. Every message that leaves for devices is
issued from it by :func:`issue_command`: freshly dated, expiring after the plan's command TTL,
addressed to exactly the devices (and wave) it is sent to, carrying the next sequence number
of the signing key (persisted here), and signed. A wave that starts hours after the canary
therefore gets its own command, and a captured one is useless elsewhere and later.

Every issued command's digest (the sha256 of the message as published) is kept with its
deployment, action and targets (``issued_commands``), before it is sent. A device that refuses a
command quotes that digest; the refusal counts toward a rollout only when it is of a command
issued here *to that device* (and, for an install, before the device reported any work on the
deployment) — :func:`judge_refusal`. Anything else (a forged or replayed copy someone else
published on the device's topic) changes no rollout; the fleet service records it as a
security event.

The rollout controller writes every decision and every device status here before acting on
it, so a controller that is stopped or crashes is resumed from the database (``fleet push
--deployment-id ID`` again), and ``fleet status/abort/rollback`` work from another shell while
a rollout runs. One file, WAL mode, short transactions.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from edgesdk.errors import UpdateError, UsageError
from edgesdk.protocol.chunks import DEFAULT_CHUNK_SIZE, chunk_hashes
from edgesdk.protocol.signing import sign_deployment
from edgesdk.schemas.messages import Deployment, HealthCriteria, OtaStatus, RefusalKind

#: Rollout states of a whole deployment.
PENDING, IN_PROGRESS, SUCCEEDED, ABORTED, ROLLED_BACK = "PENDING", "IN_PROGRESS", "SUCCEEDED", "ABORTED", "ROLLED_BACK"
FINISHED_ROLLOUT_STATES = frozenset({SUCCEEDED, ABORTED, ROLLED_BACK})
#: Device states that end a device's part of a wave.
DEVICE_SUCCESS = frozenset({"COMMITTED"})
DEVICE_FAILURE = frozenset({"FAILED", "ROLLED_BACK", "TIMED_OUT"})

DEFAULT_DB_ENV = "EDGESDK_FLEET_DB"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS deployments (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    bundle_path TEXT NOT NULL,
    message TEXT NOT NULL,          -- the signed Deployment JSON sent to devices
    plan TEXT NOT NULL,             -- RolloutPlan JSON
    state TEXT NOT NULL,
    wave INTEGER NOT NULL DEFAULT -1,
    reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS issuers (
    key_id TEXT PRIMARY KEY,        -- the operator key that signs commands
    sequence INTEGER NOT NULL       -- the last sequence it issued (devices refuse anything not above)
);
CREATE TABLE IF NOT EXISTS follow_ups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment_id TEXT NOT NULL REFERENCES deployments(id),
    action TEXT NOT NULL,           -- cancel | rollback: owed to devices by a decision
    wave INTEGER,
    devices TEXT NOT NULL,          -- JSON list of device ids
    ttl_s REAL NOT NULL,
    created REAL NOT NULL,
    delivered REAL                  -- NULL until published
);
CREATE TABLE IF NOT EXISTS issued_commands (
    digest TEXT PRIMARY KEY,        -- sha256 of the command message as published
    deployment_id TEXT NOT NULL REFERENCES deployments(id),
    action TEXT NOT NULL,           -- install | cancel | rollback
    targets TEXT NOT NULL,          -- JSON list of device ids
    sequence INTEGER NOT NULL,
    issued REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    deployment_id TEXT NOT NULL REFERENCES deployments(id),
    device_id TEXT NOT NULL,
    wave INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'PENDING',
    reason TEXT NOT NULL DEFAULT '',
    progress REAL,
    model_release INTEGER,
    sent REAL,
    updated REAL,
    status_ts TEXT,
    PRIMARY KEY (deployment_id, device_id)
);
"""


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


class RolloutStore(SequenceSource, Protocol):
    """The port the rollout controller persists through: :class:`DeploymentStore` (the
    operator's SQLite file) and the fleet service's SQLAlchemy store implement it."""

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


class DeploymentStore:
    """The operator's SQLite database of deployments and per-device results."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._db().executescript(_SCHEMA)  # executescript manages its own transaction

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- deployments --------------------------------------------------------------------------

    def create(self, message: Deployment, bundle_path: Path, plan: dict[str, Any], waves: list[list[str]]) -> None:
        now = time.time()
        with self._tx() as db:
            if db.execute("SELECT 1 FROM deployments WHERE id = ?", (message.deployment_id,)).fetchone():
                raise UsageError(f"deployment {message.deployment_id!r} already exists; pick another id")
            db.execute(
                "INSERT INTO deployments (id, created, updated, bundle_path, message, plan, state) VALUES (?,?,?,?,?,?,?)",
                (
                    message.deployment_id,
                    now,
                    now,
                    str(bundle_path.resolve()),
                    message.model_dump_json(),
                    json.dumps(plan),
                    PENDING,
                ),
            )
            db.executemany(
                "INSERT INTO devices (deployment_id, device_id, wave) VALUES (?,?,?)",
                [(message.deployment_id, device, index) for index, wave in enumerate(waves) for device in wave],
            )

    def get(self, deployment_id: str) -> DeploymentRow:
        row = self._db().execute("SELECT * FROM deployments WHERE id = ?", (deployment_id,)).fetchone()
        if row is None:
            known = [r.id for r in self.all()][-10:]
            raise UsageError(
                f"deployment {deployment_id!r} not found in {self.path}; recent: {', '.join(known) or 'none'}"
            )
        return _deployment(row)

    def all(self) -> list[DeploymentRow]:
        rows = self._db().execute("SELECT * FROM deployments ORDER BY created").fetchall()
        return [_deployment(r) for r in rows]

    def set_state(
        self,
        deployment_id: str,
        state: str,
        *,
        reason: str | None = None,
        wave: int | None = None,
        follow_up: FollowUp | None = None,
    ) -> None:
        """The new state, and the commands it owes (``follow_up``), in one transaction."""
        with self._tx() as db:
            db.execute(
                "UPDATE deployments SET state = ?, updated = ?, reason = COALESCE(?, reason), wave = COALESCE(?, wave) "
                "WHERE id = ?",
                (state, time.time(), reason, wave, deployment_id),
            )
            if follow_up is not None:
                db.execute(
                    "INSERT INTO follow_ups (deployment_id, action, wave, devices, ttl_s, created) VALUES (?,?,?,?,?,?)",
                    (
                        follow_up.deployment_id,
                        follow_up.action,
                        follow_up.wave,
                        json.dumps(list(follow_up.devices)),
                        follow_up.ttl_s,
                        time.time(),
                    ),
                )

    def pending_follow_ups(self, deployment_id: str | None = None) -> list[FollowUp]:
        query = "SELECT * FROM follow_ups WHERE delivered IS NULL"
        args: tuple[Any, ...] = ()
        if deployment_id is not None:
            query += " AND deployment_id = ?"
            args = (deployment_id,)
        rows = self._db().execute(query + " ORDER BY id", args).fetchall()
        return [
            FollowUp(r["deployment_id"], r["action"], tuple(json.loads(r["devices"])), r["wave"], r["ttl_s"], r["id"])
            for r in rows
        ]

    def follow_up_delivered(self, follow_up_id: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE follow_ups SET delivered = ? WHERE id = ?", (time.time(), follow_up_id))

    # -- command sequence numbers -----------------------------------------------------------

    def next_sequence(self, issuer: str) -> int:
        """The next sequence number of ``issuer`` (an operator key id), persisted before it is
        used: strictly above every one this database issued, and at least the current Unix time
        in milliseconds, so a new or restored database (or a second operator machine with the
        same key and a sane clock) still issues numbers the devices accept."""
        floor = int(time.time() * 1000)
        with self._tx() as db:
            row = db.execute("SELECT sequence FROM issuers WHERE key_id = ?", (issuer,)).fetchone()
            sequence = max(floor, (row["sequence"] + 1) if row else 0)
            db.execute(
                "INSERT INTO issuers (key_id, sequence) VALUES (?, ?) "
                "ON CONFLICT(key_id) DO UPDATE SET sequence = excluded.sequence",
                (issuer, sequence),
            )
        return sequence

    # -- devices ------------------------------------------------------------------------------

    def devices(self, deployment_id: str, wave: int | None = None) -> list[DeviceRow]:
        query = "SELECT * FROM devices WHERE deployment_id = ?"
        args: tuple[Any, ...] = (deployment_id,)
        if wave is not None:
            query += " AND wave = ?"
            args += (wave,)
        rows = self._db().execute(query + " ORDER BY wave, device_id", args).fetchall()
        return [
            DeviceRow(
                r["deployment_id"],
                r["device_id"],
                r["wave"],
                r["state"],
                r["reason"],
                r["progress"],
                r["model_release"],
                r["updated"],
            )
            for r in rows
        ]

    def wave_count(self, deployment_id: str) -> int:
        row = self._db().execute("SELECT MAX(wave) FROM devices WHERE deployment_id = ?", (deployment_id,)).fetchone()
        return -1 if row[0] is None else int(row[0]) + 1

    def mark_sent(self, deployment_id: str, device_ids: list[str]) -> None:
        now = time.time()
        with self._tx() as db:
            db.executemany(
                "UPDATE devices SET sent = ?, state = CASE WHEN state = 'PENDING' THEN 'SENT' ELSE state END "
                "WHERE deployment_id = ? AND device_id = ?",
                [(now, deployment_id, d) for d in device_ids],
            )

    def set_device_state(self, deployment_id: str, device_id: str, state: str, reason: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE devices SET state = ?, reason = ?, updated = ? WHERE deployment_id = ? AND device_id = ?",
                (state, reason, time.time(), deployment_id, device_id),
            )

    def record_issued(self, digest: str, command: Deployment) -> None:
        """Remember a command before it is sent (its digest is what a device's refusal quotes)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO issued_commands (digest, deployment_id, action, targets, sequence, issued) "
                "VALUES (?,?,?,?,?,?)",
                (
                    digest,
                    command.deployment_id,
                    command.action,
                    json.dumps(sorted(command.targets)),
                    command.sequence or 0,
                    time.time(),
                ),
            )

    def record_refusal(self, device_id: str, command_sha256: str, reason: str, ts: datetime) -> RefusalVerdict:
        """Judge a device's refusal of the command ``command_sha256`` (:func:`judge_refusal`);
        when it counts, the device's row becomes FAILED with the reason."""
        stamp = ts.isoformat()
        with self._tx() as db:
            found = db.execute("SELECT * FROM issued_commands WHERE digest = ?", (command_sha256,)).fetchone()
            issued = (
                IssuedCommand(
                    found["digest"], found["deployment_id"], found["action"], tuple(json.loads(found["targets"]))
                )
                if found
                else None
            )
            row = None
            if issued is not None:
                current = db.execute(
                    "SELECT state, status_ts FROM devices WHERE deployment_id = ? AND device_id = ?",
                    (issued.deployment_id, device_id),
                ).fetchone()
                row = (current["state"], current["status_ts"]) if current else None
            verdict = judge_refusal(issued, device_id, row, stamp)
            if verdict.counted and row is not None and (row[1] is None or row[1] <= stamp):
                db.execute(
                    "UPDATE devices SET state = 'FAILED', reason = ?, progress = NULL, updated = ?, status_ts = ? "
                    "WHERE deployment_id = ? AND device_id = ?",
                    (refusal_reason(device_id, reason), time.time(), stamp, verdict.deployment_id, device_id),
                )
        return verdict

    def record_status(self, status: OtaStatus) -> bool:
        """Store a device's status if it belongs to a known (deployment, device) and is not older
        than what we have (QoS 1 may redeliver and reorder). Returns True when stored. A refusal
        (``command_sha256`` set) is judged by :meth:`record_refusal` instead."""
        if status.command_sha256 is not None:
            return self.record_refusal(status.device_id, status.command_sha256, status.reason, status.ts).counted
        ts = status.ts.isoformat()
        release = status.model.release if status.model else None
        with self._tx() as db:
            row = db.execute(
                "SELECT status_ts, state FROM devices WHERE deployment_id = ? AND device_id = ?",
                (status.deployment_id, status.device_id),
            ).fetchone()
            if row is None or not status_applies(row["state"], row["status_ts"], status):
                return False
            db.execute(
                "UPDATE devices SET state = ?, reason = ?, progress = ?, model_release = ?, updated = ?, status_ts = ? "
                "WHERE deployment_id = ? AND device_id = ?",
                (
                    status.state,
                    status.reason,
                    status.progress,
                    release,
                    time.time(),
                    ts,
                    status.deployment_id,
                    status.device_id,
                ),
            )
        return True

    def summary(self, deployment_id: str) -> dict[str, Any]:
        """Counts by device state, per wave and overall (for ``fleet status``)."""
        return summarize(self.get(deployment_id), self.devices(deployment_id))


def _deployment(row: sqlite3.Row) -> DeploymentRow:
    try:
        message = Deployment.model_validate_json(row["message"])
    except ValueError as exc:  # pragma: no cover - only a hand-edited database gets here
        raise UpdateError(f"deployment {row['id']!r}: stored message unreadable: {exc}") from exc
    return DeploymentRow(
        id=row["id"],
        created=row["created"],
        updated=row["updated"],
        bundle_path=row["bundle_path"],
        message=message,
        plan=json.loads(row["plan"]),
        state=row["state"],
        wave=row["wave"],
        reason=row["reason"],
    )
