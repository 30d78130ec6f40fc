"""Device refusals in the fleet service: counted toward a rollout, or recorded as security events.

A device answers a signed command it will not run with a FAILED ``ota/status`` carrying the
command's digest, and a message whose signature does not verify with an ``ota_refused`` event
carrying the digest (and no status). The ingest hands both here after its batch committed.
:func:`~edgesdk.fleet.deployments.judge_refusals` (the rollout controller's path too) picks them out
and the store judges each (``RolloutStore.record_refusal``: only a refusal of a command this service
issued to that device counts, and then the device's row is FAILED with ``refused by DEVICE: …``,
which the rollout's failure threshold sees at its next poll). A refusal that does not count — a
forged or replayed copy of a command published on the device's topic — changes no rollout and is
written to ``security_events`` (de-duplicated by the device message it came from), where the API
(``GET /api/v1/security-events``) and the dashboard show it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from edgesdk.fleet.deployments import Refusal, RefusalVerdict, RolloutStore, judge_refusals
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction, insert_ignoring_duplicates, inserted_new_row
from edgesdk.schemas.messages import Event, OtaStatus

log = logging.getLogger(__name__)


class Refusals:
    """Judges the refusals of one ingest's batches and records those that do not count."""

    def __init__(self, engine: Any, where: str, store: RolloutStore) -> None:
        self.engine = engine
        self.where = where
        self.store = store
        self._insert = insert_ignoring_duplicates(engine, schema.security_events)

    def handle(self, statuses: Iterable[OtaStatus], events: Iterable[Event]) -> tuple[int, int]:
        """Judge every refusal among ``statuses`` and ``events``; (counted, new security events)."""
        counted = recorded = 0
        for refusal, verdict in judge_refusals(self.store, statuses, events):
            if verdict.counted:
                log.warning(
                    "deployment %s: refused by %s: %s", verdict.deployment_id, refusal.device_id, refusal.reason
                )
                counted += 1
            else:
                recorded += self._security_event(refusal, verdict)
        return counted, recorded

    def _security_event(self, refusal: Refusal, verdict: RefusalVerdict) -> bool:
        """Record a refusal that does not count; False when already recorded (a redelivery)."""
        log.warning(
            "security event %s: %s refused a command this service did not issue to it (digest %s, claims "
            "deployment %s): %s",
            verdict.security_event,
            refusal.device_id,
            refusal.command_sha256[:12],
            refusal.claimed_deployment,
            refusal.reason,
        )
        statement = self._insert.values(
            ts=refusal.ts.timestamp(),
            device_id=refusal.device_id,
            msg_id=refusal.msg_id,
            kind=verdict.security_event or "",
            deployment_id=refusal.claimed_deployment,
            command_sha256=refusal.command_sha256,
            why=refusal.why,
            reason=refusal.reason,
        )
        with Transaction(self.engine, self.where) as db:
            return inserted_new_row(db, statement, schema.security_events.c.id)


def recent(
    engine: Any, *, deployment_id: str | None = None, device_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The newest security events (of one claimed deployment or one device), newest first."""
    import sqlalchemy as sa

    table = schema.security_events
    query = sa.select(table)
    if deployment_id is not None:
        query = query.where(table.c.deployment_id == deployment_id)
    if device_id is not None:
        query = query.where(table.c.device_id == device_id)
    with Transaction(engine) as db:
        rows = db.execute(query.order_by(table.c.ts.desc()).limit(limit)).all()
    return [dict(r._mapping) for r in rows]
