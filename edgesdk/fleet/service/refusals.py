"""Device refusals in the fleet service: counted toward a rollout, or recorded as security events.

A device answers a signed command it will not run with a FAILED ``ota/status`` carrying the
command's digest, and a message whose signature does not verify with an ``ota_refused`` event
carrying the digest (and no status). The ingest hands both here after its batch committed. The
store judges each (``RolloutStore.record_refusal``: only a refusal of a command this service
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

from pydantic import ValidationError

from edgesdk.fleet.deployments import UNVERIFIED_REFUSALS, RefusalVerdict, RolloutStore
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction, insert_ignoring_duplicates
from edgesdk.schemas.messages import CommandRefusal, Event, OtaStatus

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
        for status in statuses:
            if status.command_sha256 is None:
                continue
            verdict = self.store.record_refusal(status.device_id, status.command_sha256, status.reason, status.ts)
            ok, new = self._after(verdict, status.device_id, status.msg_id, status.ts.timestamp(),
                                  status.deployment_id, status.command_sha256, None, status.reason)  # fmt: skip
            counted, recorded = counted + ok, recorded + new
        for event in events:
            if event.event != "ota_refused":
                continue
            try:
                refusal = CommandRefusal.model_validate(event.detail)
            except ValidationError:
                continue  # an older agent's event, without the digest: nothing to match
            if refusal.why not in UNVERIFIED_REFUSALS:
                continue  # a signed command's refusal: its FAILED status (above) carries it
            reason = f"refused: {refusal.reason}"
            verdict = self.store.record_refusal(event.device_id, refusal.command_sha256, reason, event.ts)
            ok, new = self._after(verdict, event.device_id, event.msg_id, event.ts.timestamp(),
                                  refusal.deployment_id, refusal.command_sha256, refusal.why, reason)  # fmt: skip
            counted, recorded = counted + ok, recorded + new
        return counted, recorded

    def _after(
        self,
        verdict: RefusalVerdict,
        device_id: str,
        msg_id: str,
        ts: float,
        claimed: str | None,
        digest: str,
        why: str | None,
        reason: str,
    ) -> tuple[bool, bool]:
        """(counted, a new security event written) — a redelivered message writes none."""
        if verdict.counted:
            log.warning("deployment %s: refused by %s: %s", verdict.deployment_id, device_id, reason)
            return True, False
        log.warning(
            "security event %s: %s refused a command this service did not issue to it (digest %s, claims "
            "deployment %s): %s",
            verdict.security_event,
            device_id,
            digest[:12],
            claimed,
            reason,
        )
        with Transaction(self.engine, self.where) as db:
            written = db.execute(
                self._insert.values(
                    ts=ts,
                    device_id=device_id,
                    msg_id=msg_id,
                    kind=verdict.security_event or "",
                    deployment_id=claimed,
                    command_sha256=digest,
                    why=why,
                    reason=reason,
                )
            )
        return False, written.rowcount == 1


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
