"""Handing the service work: a deployment stored PENDING, which the running service picks up
at its next poll (from ``edgesdk fleet submit``, the REST API, tests)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from edgesdk.errors import UsageError
from edgesdk.fleet.rollout import RolloutPlan, create_deployment
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.store import SqlRolloutStore
from edgesdk.schemas.messages import Deployment, HealthCriteria


def submit_deployment(
    store: SqlRolloutStore,
    bundle: Path,
    plan: RolloutPlan,
    *,
    devices: list[str] | None = None,
    group: str | None = None,
    deployment_id: str | None = None,
    health: HealthCriteria | None = None,
    chunk_size: int | None = None,
    artifact_urls: list[str] | tuple[str, ...] = (),
    mqtt_fallback: bool = True,
) -> Deployment:
    """Store a PENDING deployment of ``bundle`` to ``devices`` or the known members of ``group``;
    the running service starts it at its next poll."""
    if (devices is None) == (group is None):
        raise UsageError("give exactly one of --group G or --devices A,B")
    targets = devices if devices is not None else devices_in_group(store.engine, group or "")
    return create_deployment(
        store,
        bundle,
        targets,
        with_group_window(store.engine, plan, group),
        deployment_id=deployment_id,
        health=health,
        chunk_size=chunk_size,
        artifact_urls=artifact_urls,
        mqtt_fallback=mqtt_fallback,
    )


def with_group_window(engine: Any, plan: RolloutPlan, group: str | None) -> RolloutPlan:
    """``plan`` with ``group``'s maintenance window when it names none of its own."""
    if group is None or plan.window is not None:
        return plan
    table = schema.maintenance_windows
    with Transaction(engine) as db:
        row = db.execute(sa.select(table).where(table.c.group_name == group)).first()
    return plan if row is None else dataclasses.replace(plan, window=row.window, window_tz=row.window_tz)


def devices_in_group(engine: Any, group: str) -> list[str]:
    """Devices whose last presence listed ``group`` (online or not)."""
    table = schema.devices
    with Transaction(engine) as db:
        rows = db.execute(sa.select(table.c.device_id, table.c.groups)).all()
    found = sorted(r.device_id for r in rows if group in json.loads(r.groups or "[]"))
    if not found:
        raise UsageError(f"no device of group {group!r} is known to the fleet service")
    return found
