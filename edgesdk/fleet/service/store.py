"""The one deployment store: the rollout controller's port (``RolloutStore``) on SQLAlchemy Core.

The fleet service keeps it in its database (PostgreSQL or SQLite); the standalone ``edgesdk fleet
push`` in one SQLite file (:mod:`edgesdk.fleet.service.operator_db`). Every method is one
short transaction; ``next_sequence`` locks the issuer's row (``SELECT … FOR UPDATE`` on
PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already holds the write lock) so two rollouts signing
at once never get the same number.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from edgesdk.errors import UpdateError, UsageError
from edgesdk.fleet.deployments import (
    PENDING,
    DeploymentRow,
    DeviceRow,
    FollowUp,
    IssuedCommand,
    RefusalVerdict,
    judge_refusal,
    refusal_reason,
    status_applies,
    summarize,
)
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction, safe_url
from edgesdk.schemas.messages import Deployment, OtaStatus


class SqlRolloutStore:
    """Deployments, per-device results, issued sequences and owed commands in the service DB."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.where = safe_url(engine)

    def _begin(self) -> Any:
        return Transaction(self.engine, self.where)

    # -- deployments ------------------------------------------------------------------------

    def create(self, message: Deployment, bundle_path: Path, plan: dict[str, Any], waves: list[list[str]]) -> None:
        now = time.time()
        try:
            with self._begin() as db:
                db.execute(
                    schema.deployments.insert().values(
                        id=message.deployment_id,
                        created=now,
                        updated=now,
                        bundle_path=str(Path(bundle_path).resolve()),
                        message=message.model_dump_json(),
                        plan=json.dumps(plan),
                        state=PENDING,
                        wave=-1,
                        reason="",
                    )
                )
                db.execute(
                    schema.deployment_devices.insert(),
                    [
                        {"deployment_id": message.deployment_id, "device_id": device, "wave": index, "state": "PENDING"}
                        for index, wave in enumerate(waves)
                        for device in wave
                    ],
                )
        except IntegrityError as exc:
            raise UsageError(f"deployment {message.deployment_id!r} already exists; pick another id") from exc

    def find(self, deployment_id: str) -> DeploymentRow | None:
        """The deployment, or None when there is none with this id."""
        with self._begin() as db:
            row = db.execute(sa.select(schema.deployments).where(schema.deployments.c.id == deployment_id)).first()
        return None if row is None else _deployment(row)

    def get(self, deployment_id: str) -> DeploymentRow:
        row = self.find(deployment_id)
        if row is None:
            known = [r.id for r in self.all()][-10:]
            raise UsageError(
                f"deployment {deployment_id!r} not found in {self.where}; recent: {', '.join(known) or 'none'}"
            )
        return row

    def all(self) -> list[DeploymentRow]:
        with self._begin() as db:
            rows = db.execute(sa.select(schema.deployments).order_by(schema.deployments.c.created)).all()
        return [_deployment(r) for r in rows]

    def newest_page(self, *, limit: int, offset: int, state: str | None = None) -> tuple[list[DeploymentRow], int]:
        """One page of the deployments (in ``state``), newest first, and how many there are: the
        database pages (LIMIT/OFFSET), so a page reads its rows only. Ties in ``created`` are
        broken by id, so that consecutive pages neither repeat nor skip a deployment."""
        table = schema.deployments
        chosen = sa.true() if state is None else table.c.state == state
        query = sa.select(table).where(chosen).order_by(table.c.created.desc(), table.c.id.desc())
        with self._begin() as db:
            total = int(db.execute(sa.select(sa.func.count()).select_from(table).where(chosen)).scalar_one())
            rows = db.execute(query.limit(limit).offset(offset)).all()
        return [_deployment(r) for r in rows], total

    def in_states(self, states: set[str]) -> list[str]:
        """Ids of the deployments in ``states``, oldest first (what the service must drive)."""
        table = schema.deployments
        with self._begin() as db:
            rows = db.execute(sa.select(table.c.id).where(table.c.state.in_(states)).order_by(table.c.created)).all()
        return [r.id for r in rows]

    def set_state(
        self,
        deployment_id: str,
        state: str,
        *,
        reason: str | None = None,
        wave: int | None = None,
        follow_up: FollowUp | None = None,
    ) -> None:
        values: dict[str, Any] = {"state": state, "updated": time.time()}
        if reason is not None:
            values["reason"] = reason
        if wave is not None:
            values["wave"] = wave
        with self._begin() as db:
            db.execute(schema.deployments.update().where(schema.deployments.c.id == deployment_id).values(**values))
            if follow_up is not None:
                db.execute(
                    schema.follow_ups.insert().values(
                        deployment_id=follow_up.deployment_id,
                        action=follow_up.action,
                        wave=follow_up.wave,
                        devices=json.dumps(list(follow_up.devices)),
                        ttl_s=follow_up.ttl_s,
                        created=time.time(),
                    )
                )

    def pending_follow_ups(self, deployment_id: str | None = None) -> list[FollowUp]:
        table = schema.follow_ups
        query = sa.select(table).where(table.c.delivered.is_(None))
        if deployment_id is not None:
            query = query.where(table.c.deployment_id == deployment_id)
        with self._begin() as db:
            rows = db.execute(query.order_by(table.c.id)).all()
        return [FollowUp(r.deployment_id, r.action, tuple(json.loads(r.devices)), r.wave, r.ttl_s, r.id) for r in rows]

    def follow_up_delivered(self, follow_up_id: int) -> None:
        with self._begin() as db:
            db.execute(
                schema.follow_ups.update().where(schema.follow_ups.c.id == follow_up_id).values(delivered=time.time())
            )

    # -- command sequence numbers -----------------------------------------------------------

    def next_sequence(self, issuer: str) -> int:
        """The next sequence number of ``issuer`` (an operator key id), persisted before it is
        used: strictly above every one this database issued, and at least the current Unix time
        in milliseconds, so a new or restored database (or a second operator machine with the
        same key and a sane clock) still issues numbers the devices accept."""
        table = schema.issuers
        floor = int(time.time() * 1000)
        with self._begin() as db:
            row = db.execute(sa.select(table.c.sequence).where(table.c.key_id == issuer).with_for_update()).first()
            sequence = max(floor, (row.sequence + 1) if row else 0)
            if row is None:
                db.execute(table.insert().values(key_id=issuer, sequence=sequence))
            else:
                db.execute(table.update().where(table.c.key_id == issuer).values(sequence=sequence))
        return sequence

    # -- devices ----------------------------------------------------------------------------

    def devices(self, deployment_id: str, wave: int | None = None) -> list[DeviceRow]:
        table = schema.deployment_devices
        query = sa.select(table).where(table.c.deployment_id == deployment_id)
        if wave is not None:
            query = query.where(table.c.wave == wave)
        with self._begin() as db:
            rows = db.execute(query.order_by(table.c.wave, table.c.device_id)).all()
        return [
            DeviceRow(
                r.deployment_id, r.device_id, r.wave, r.state, r.reason, r.progress, r.model_release, r.updated, r.sent
            )
            for r in rows
        ]

    def wave_count(self, deployment_id: str) -> int:
        table = schema.deployment_devices
        with self._begin() as db:
            top = db.execute(
                sa.select(sa.func.max(table.c.wave)).where(table.c.deployment_id == deployment_id)
            ).scalar()
        return -1 if top is None else int(top) + 1

    def mark_sent(self, deployment_id: str, device_ids: list[str]) -> None:
        if not device_ids:
            return
        table = schema.deployment_devices
        now = time.time()
        with self._begin() as db:
            match = (table.c.deployment_id == deployment_id) & table.c.device_id.in_(device_ids)
            # The first time only: a resumed wave's deadline still counts from its first send.
            db.execute(table.update().where(match).values(sent=sa.func.coalesce(table.c.sent, now)))
            db.execute(table.update().where(match & (table.c.state == "PENDING")).values(state="SENT"))

    def set_device_state(self, deployment_id: str, device_id: str, state: str, reason: str) -> None:
        table = schema.deployment_devices
        with self._begin() as db:
            db.execute(
                table.update()
                .where((table.c.deployment_id == deployment_id) & (table.c.device_id == device_id))
                .values(state=state, reason=reason, updated=time.time())
            )

    def record_issued(self, digest: str, command: Deployment) -> None:
        """Remember a command before it is sent (its digest is what a device's refusal quotes)."""
        table = schema.issued_commands
        with self._begin() as db:
            if db.execute(sa.select(table.c.digest).where(table.c.digest == digest)).first() is not None:
                return  # the same bytes again: nothing new to remember
            db.execute(
                table.insert().values(
                    digest=digest,
                    deployment_id=command.deployment_id,
                    action=command.action,
                    targets=json.dumps(sorted(command.targets)),
                    sequence=command.sequence or 0,
                    issued=time.time(),
                )
            )

    def record_refusal(self, device_id: str, command_sha256: str, reason: str, ts: datetime) -> RefusalVerdict:
        """Judge a device's refusal of the command ``command_sha256`` (``judge_refusal``); when
        it counts, the device's row becomes FAILED with the reason."""
        issued_table, table = schema.issued_commands, schema.deployment_devices
        stamp = ts.isoformat()
        with self._begin() as db:
            found = db.execute(sa.select(issued_table).where(issued_table.c.digest == command_sha256)).first()
            issued = (
                IssuedCommand(found.digest, found.deployment_id, found.action, tuple(json.loads(found.targets)))
                if found is not None
                else None
            )
            row = None
            match = None
            if issued is not None:
                match = (table.c.deployment_id == issued.deployment_id) & (table.c.device_id == device_id)
                current = db.execute(sa.select(table.c.state, table.c.status_ts).where(match).with_for_update()).first()
                row = (current.state, current.status_ts) if current is not None else None
            verdict = judge_refusal(issued, device_id, row, stamp)
            if verdict.counted and match is not None and row is not None and (row[1] is None or row[1] <= stamp):
                db.execute(
                    table.update()
                    .where(match)
                    .values(
                        state="FAILED",
                        reason=refusal_reason(device_id, reason),
                        progress=None,
                        updated=time.time(),
                        status_ts=stamp,
                    )
                )
        return verdict

    def record_status(self, status: OtaStatus) -> bool:
        """Store a device's status if it belongs to a known (deployment, device) and is not older
        than what is stored (see ``status_applies``). Returns True when stored. A refusal
        (``command_sha256`` set) is judged by :meth:`record_refusal` instead."""
        if status.command_sha256 is not None:
            return self.record_refusal(status.device_id, status.command_sha256, status.reason, status.ts).counted
        table = schema.deployment_devices
        match = (table.c.deployment_id == status.deployment_id) & (table.c.device_id == status.device_id)
        with self._begin() as db:
            row = db.execute(sa.select(table.c.state, table.c.status_ts).where(match).with_for_update()).first()
            if row is None or not status_applies(row.state, row.status_ts, status):
                return False
            db.execute(
                table.update()
                .where(match)
                .values(
                    state=status.state,
                    reason=status.reason,
                    progress=status.progress,
                    model_release=status.model.release if status.model else None,
                    updated=time.time(),
                    status_ts=status.ts.isoformat(),
                )
            )
        return True

    def summary(self, deployment_id: str) -> dict[str, Any]:
        return summarize(self.get(deployment_id), self.devices(deployment_id))


def _deployment(row: Any) -> DeploymentRow:
    try:
        message = Deployment.model_validate_json(row.message)
    except ValueError as exc:  # pragma: no cover - only a hand-edited database gets here
        raise UpdateError(f"deployment {row.id!r}: stored message unreadable: {exc}") from exc
    return DeploymentRow(
        id=row.id,
        created=row.created,
        updated=row.updated,
        bundle_path=row.bundle_path,
        message=message,
        plan=json.loads(row.plan),
        state=row.state,
        wave=row.wave,
        reason=row.reason,
    )
