"""The audit log: every write through the API, allowed or refused — who, what, when, outcome
(``ok``; ``refused`` with the HTTP status in ``detail.status``; ``failed`` with the error)."""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa

from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction


def record(
    engine: Any,
    *,
    actor: str,
    role: str | None,
    action: str,
    target: str = "",
    outcome: str = "ok",
    detail: dict[str, Any] | None = None,
) -> None:
    with Transaction(engine) as db:
        db.execute(
            schema.audit_log.insert().values(
                ts=time.time(),
                actor=actor,
                role=role,
                action=action,
                target=target[:128],
                outcome=outcome,
                detail=json.dumps(detail or {}, default=str),
            )
        )


def entries(engine: Any, *, limit: int = 200, offset: int = 0) -> list[dict[str, Any]]:
    """The newest ``limit`` entries after the newest ``offset``, newest first."""
    table = schema.audit_log
    with Transaction(engine) as db:
        rows = db.execute(sa.select(table).order_by(table.c.id.desc()).limit(limit).offset(offset)).all()
    return [
        {
            "ts": r.ts,
            "actor": r.actor,
            "role": r.role,
            "action": r.action,
            "target": r.target,
            "outcome": r.outcome,
            "detail": json.loads(r.detail),
        }
        for r in rows
    ]


def count(engine: Any) -> int:
    """How many entries the log holds."""
    with Transaction(engine) as db:
        return int(db.execute(sa.select(sa.func.count()).select_from(schema.audit_log)).scalar_one())


def audited(
    engine: Any, operator: Any, action: str, target: str, work: Any, detail: dict[str, Any] | None = None
) -> Any:
    """Run ``work()`` and record it as done by ``operator`` (``ok``, or ``failed`` with the
    error, which is raised again)."""
    from edgesdk.errors import EdgeSDKError

    try:
        result = work()
    except EdgeSDKError as exc:
        record(
            engine,
            actor=operator.actor,
            role=operator.role,
            action=action,
            target=target,
            outcome="failed",
            detail={**(detail or {}), "error": str(exc)},
        )
        exc.edgesdk_audited = True  # type: ignore[attr-defined]  # the API's error handler records it once
        raise
    record(engine, actor=operator.actor, role=operator.role, action=action, target=target, detail=detail)
    return result
