"""The REST API's deployments: list, one (per-device states, timeline, security events),
create (refusing what cannot succeed: unknown devices or group, a taken id), abort, rollback;
the security events; and ``/artifacts``, the bundles of running rollouts for devices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi import Depends, HTTPException, Query
from fastapi.responses import FileResponse

from edgesdk.errors import UsageError
from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES
from edgesdk.fleet.rollout import RolloutPlan
from edgesdk.fleet.service import bundles, refusals, schema, tokens
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.rest.context import ApiContext, api_context, signed_in
from edgesdk.fleet.service.rest.routing import (
    ONE_ERRORS,
    READ_ERRORS,
    WRITE_ERRORS,
    Paging,
    Route,
    RouteTable,
    audited_call,
    found_or_404,
    paging,
)
from edgesdk.fleet.service.rest.schemas import (
    MAX_WAVE_TIMEOUT_S,
    CommandOptions,
    DeploymentCreate,
    DeploymentDetail,
    DeploymentSummary,
    Page,
    RolloutState,
    SecurityEvent,
)
from edgesdk.fleet.service.rest.targeting import resolve_target
from edgesdk.fleet.service.store import SqlRolloutStore
from edgesdk.fleet.service.submit import submit_deployment
from edgesdk.schemas.messages import HealthCriteria


def list_deployments(
    state: RolloutState | None = None,
    page: Paging = Depends(paging),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """Newest first."""
    rows, total = context.store.newest_page(limit=page.limit, offset=page.offset, state=state)
    return page.page([_summary(context.store, row.id) for row in rows], total, sliced=True)


def get_deployment(deployment_id: str, context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    _known_deployment(context.store, deployment_id)
    return _detail(context.engine, context.store, deployment_id)


def security_events(
    device_id: str | None = Query(None, max_length=64),
    deployment_id: str | None = Query(None, max_length=64),
    page: Paging = Depends(paging),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """Device refusals of commands this service did not issue to them, newest first."""
    engine = context.engine
    newest = refusals.recent(engine, deployment_id=deployment_id, device_id=device_id, limit=page.offset + page.limit)
    table = schema.security_events
    count = sa.select(sa.func.count()).select_from(table)
    if deployment_id is not None:
        count = count.where(table.c.deployment_id == deployment_id)
    if device_id is not None:
        count = count.where(table.c.device_id == device_id)
    with Transaction(engine) as db:
        total = int(db.execute(count).scalar_one())
    return page.page(newest[page.offset :], total, sliced=True)


def create_deployment(
    body: DeploymentCreate,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """409 for a deployment id already taken; 422 naming every target device the service has
    never seen (a rollout to them could never finish); 404 for an unknown bundle."""
    engine, store = context.engine, context.store
    missing = f"bundle {body.bundle_id!r} not found; upload it first (POST /api/v1/bundles)"
    bundle = found_or_404(bundles.find_bundle(engine, body.bundle_id), missing)
    if body.deployment_id is not None and store.find(body.deployment_id) is not None:
        raise HTTPException(409, f"deployment {body.deployment_id!r} already exists; pick another deployment_id")
    devices = _target_devices(engine, body)

    def work() -> Any:
        return submit_deployment(
            store,
            Path(bundle["path"]),
            _plan(body),
            devices=devices,
            group=body.group,
            deployment_id=body.deployment_id,
            health=_health(body),
            chunk_size=body.chunk_size,
            artifact_urls=body.artifact_urls,
            mqtt_fallback=body.mqtt_fallback,
        )

    target = body.deployment_id or ""
    message = audited_call(engine, operator, "deployment.create", target, work, **body.model_dump())
    return _summary(store, message.deployment_id)


def abort_deployment(
    deployment_id: str,
    body: CommandOptions | None = None,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """409 when the deployment already ended."""
    return _command(context, deployment_id, body, operator, "deployment.abort")


def rollback_deployment(
    deployment_id: str,
    body: CommandOptions | None = None,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    return _command(context, deployment_id, body, operator, "deployment.rollback")


def artifact(name: str, context: ApiContext = Depends(api_context)) -> FileResponse:
    """A bundle of a running rollout, with Range (devices resume with it). No token: devices
    have none, the bundle is encrypted to its devices, and they trust the signed hash, not
    this server; only bundles of rollouts in progress are served, by their sha256."""
    sha, _, suffix = name.partition(".")
    path = context.artifacts(sha) if context.artifacts is not None and suffix == "edgepkg" else None
    if path is None or not path.is_file():
        raise HTTPException(404, f"no bundle {name!r} is being rolled out here")
    return FileResponse(path, media_type="application/octet-stream", filename=f"{sha}.edgepkg")


_ALL = "/api/v1/deployments"
_ONE = "/api/v1/deployments/{deployment_id}"

ROUTES = RouteTable(
    "deployments",
    Route("GET", _ALL, list_deployments, "viewer", "deployments.read", Page[DeploymentSummary], READ_ERRORS),
    Route("GET", _ONE, get_deployment, "viewer", "deployments.read", DeploymentDetail, ONE_ERRORS),
    Route(
        "GET",
        "/api/v1/security-events",
        security_events,
        "viewer",
        "security_events.read",
        Page[SecurityEvent],
        READ_ERRORS,
    ),
    Route(
        "POST", _ALL, create_deployment, "operator", "deployment.create", DeploymentSummary, WRITE_ERRORS, status=201
    ),
    Route("POST", _ONE + "/abort", abort_deployment, "operator", "deployment.abort", DeploymentSummary, WRITE_ERRORS),
    Route(
        "POST",
        _ONE + "/rollback",
        rollback_deployment,
        "operator",
        "deployment.rollback",
        DeploymentSummary,
        WRITE_ERRORS,
    ),
)

#: No token: devices fetch the bundles of running rollouts. GET and HEAD registered apart: one
#: route with both gives the OpenAPI document two operations with the same id (FastAPI warns;
#: schema-driven clients need them unique).
ARTIFACT_ROUTES = RouteTable(
    "artifacts",
    Route("GET", "/artifacts/{name}", artifact, None, "", errors=(404,), options={"operation_id": "artifact_get"}),
    Route("HEAD", "/artifacts/{name}", artifact, None, "", errors=(404,), options={"operation_id": "artifact_head"}),
)


def _command(
    context: ApiContext, deployment_id: str, body: CommandOptions | None, operator: tokens.Operator, action: str
) -> dict[str, Any]:
    """Abort or roll back: the controller signs and publishes; 409 aborting what already ended."""
    row = _known_deployment(context.store, deployment_id)
    options = body or CommandOptions()
    if action == "deployment.abort" and row.state in FINISHED_ROLLOUT_STATES:
        raise HTTPException(409, f"deployment {deployment_id!r} already ended {row.state}")
    reason = options.reason or f"{action.split('.')[1]} by {operator.name}"

    def work() -> Any:
        if action == "deployment.abort":
            context.commands.abort(deployment_id, reason, ttl_s=options.expires_s)
            return None
        return context.commands.rollback(deployment_id, reason, ttl_s=options.expires_s)

    asked = audited_call(context.engine, operator, action, deployment_id, work, reason=reason)
    summary = _summary(context.store, deployment_id)
    if asked is not None:
        summary["asked"] = asked
    return summary


def _target_devices(engine: Any, body: DeploymentCreate) -> list[str] | None:
    """The devices the body names (its list, or what its filter selects now), each known to
    the service; None for a group, which must be one some known device announced."""
    devices = body.devices if body.group is None else None
    if body.target_filter is not None or body.where is not None:
        devices = resolve_target(engine, body.target_filter, body.where)
    if devices is not None:
        _refuse_unknown_devices(engine, devices)
    else:
        _refuse_unknown_group(engine, body.group or "")
    return devices


def _health(body: DeploymentCreate) -> HealthCriteria:
    return HealthCriteria(
        probation_s=body.probation_s,
        p95_latency_ms=body.p95_ms,
        max_error_rate=body.max_error_rate,
        min_agreement=body.min_agreement,
        shadow_rate=body.shadow_rate,
        shadow_s=body.shadow_s,
    )


def _plan(body: DeploymentCreate) -> RolloutPlan:
    return RolloutPlan(
        canary=body.canary,
        waves=tuple(body.waves),
        max_failures=body.max_failures,
        probation_s=body.probation_s,
        wave_timeout_s=_wave_timeout_s(body),
        command_ttl_s=body.expires_s,
        start_at=body.start_at.timestamp() if body.start_at is not None else None,
        window=body.window,
        window_tz=body.window_tz,
    )


def _wave_timeout_s(body: DeploymentCreate) -> float | None:
    """The body's; with a shadow phase and none given, the default (probation + 10 min) plus the phase."""
    if body.wave_timeout_s is not None or not body.shadow_s:
        return body.wave_timeout_s
    return min(body.probation_s + body.shadow_s + 600.0, MAX_WAVE_TIMEOUT_S)


def _refuse_unknown_devices(engine: Any, device_ids: list[str]) -> None:
    """422 naming the target ids no device ever announced (as an unknown group is refused)."""
    table = schema.devices
    with Transaction(engine) as db:
        known = {r.device_id for r in db.execute(sa.select(table.c.device_id).where(table.c.device_id.in_(device_ids)))}
    unknown = [d for d in dict.fromkeys(device_ids) if d not in known]
    if unknown:
        shown = ", ".join(repr(d) for d in unknown[:10]) + (
            f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        )
        raise HTTPException(
            422, f"devices not known to the fleet service: {shown}; a device is known once it announced itself"
        )


def _refuse_unknown_group(engine: Any, group: str) -> None:
    """422 naming a group no known device announced (the same answer as unknown devices)."""
    from edgesdk.fleet.service.submit import devices_in_group

    try:
        devices_in_group(engine, group)
    except UsageError as exc:
        raise HTTPException(422, f"{exc}; a device is known once it announced itself") from exc


def _summary(store: SqlRolloutStore, deployment_id: str) -> dict[str, Any]:
    """A deployment's summary without the server's file path of its bundle (its name instead)."""
    summary = store.summary(deployment_id)
    path = summary.pop("bundle", None)
    if path:
        summary["bundle_file"] = Path(str(path)).name
    return summary


def _detail(engine: Any, store: SqlRolloutStore, deployment_id: str) -> dict[str, Any]:
    summary = _summary(store, deployment_id)
    summary["device_states"] = [
        {
            "device_id": d.device_id,
            "wave": d.wave,
            "state": d.state,
            "reason": d.reason,
            "progress": d.progress,
            "model_release": d.model_release,
            "updated": d.updated,
        }
        for d in store.devices(deployment_id)
    ]
    with Transaction(engine) as db:
        h = schema.ota_history
        rows = db.execute(sa.select(h).where(h.c.deployment_id == deployment_id).order_by(h.c.ts)).all()
    summary["timeline"] = [
        {"ts": r.ts, "device_id": r.device_id, "state": r.state, "reason": r.reason}
        for r in rows
        if r.progress is None  # progress ticks are not events of the timeline
    ]
    # Refusals quoting this deployment's id that did not count (forged or replayed copies).
    summary["security_events"] = refusals.recent(engine, deployment_id=deployment_id)
    return summary


def _known_deployment(store: SqlRolloutStore, deployment_id: str) -> Any:
    return found_or_404(store.find(deployment_id), f"deployment {deployment_id!r} not found")
