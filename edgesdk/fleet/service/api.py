"""The fleet service's REST API (FastAPI): devices, history, deployments, enrollment, bundles,
tokens, groups, alerts, the audit log and ``/healthz``.

Every route but ``/healthz`` and ``/artifacts`` needs an operator token (``Authorization:
Bearer esf_…``); reads need the viewer role, writes operator or admin (see ``tokens``). Every
error is RFC 9457 problem+json (``api_problems``); every list is a page (``limit``, ``offset``;
``{items, total, limit, offset}``). Every write — allowed, refused (401, 403, 404, 409, 422…) or
failed — is written to the audit log. The app gets the database and a ``RolloutCommands`` port
(the service's rollout controller, which signs and publishes abort/rollback commands; a
stand-in in unit tests). No CDN: the interactive docs pages (which load scripts from one) are
off; the OpenAPI document is at ``/openapi.json``. Every answer carries the security headers of
``web_security`` (CSP, frame-ancestors, nosniff, Referrer-Policy). ``/metrics`` needs a viewer
token here; ``create_metrics_app`` serves it without one, for a listener of its own that only
the scraper reaches (``--metrics-listen``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from edgesdk.errors import EnrollmentError, UsageError
from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES
from edgesdk.fleet.rollout import RolloutPlan
from edgesdk.fleet.service import alerts, api_problems, audit, bundles, refusals, schema, tokens
from edgesdk.fleet.service.api_schemas import (
    Alert,
    AuditEntry,
    Bundle,
    CommandOptions,
    Decommissioned,
    DeploymentCreate,
    DeploymentDetail,
    DeploymentSummary,
    Device,
    DeviceHistory,
    DeviceState,
    EnrollmentDecision,
    EnrollmentRequest,
    EnrollmentStatus,
    Group,
    Health,
    NewToken,
    Page,
    Problem,
    RolloutState,
    Stats,
    Token,
    TokenCreate,
)
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.ingest import read_counters
from edgesdk.fleet.service.metrics import FleetMetrics, latest_telemetry
from edgesdk.fleet.service.store import SqlRolloutStore
from edgesdk.fleet.service.submit import submit_deployment
from edgesdk.schemas.messages import HealthCriteria

log = logging.getLogger(__name__)


class RolloutCommands(Protocol):
    """What the API asks of the rollout controller (it signs and publishes)."""

    def abort(self, deployment_id: str, reason: str = ..., *, ttl_s: float | None = None) -> None: ...
    def rollback(self, deployment_id: str, reason: str = ..., *, ttl_s: float | None = None) -> int: ...


@dataclass(frozen=True)
class ApiContext:
    engine: Any
    store: SqlRolloutStore
    commands: RolloutCommands
    data_dir: Path
    registry_path: Path | None = None
    max_bundle_bytes: int = 2 << 30
    #: The file of a bundle a running rollout serves, by sha256 (``/artifacts/<sha256>.edgepkg``).
    artifacts: Callable[[str], Path | None] | None = None
    #: Where operators reach the dashboard (``--public-url``); https makes its cookies ``Secure``.
    public_url: str | None = None
    #: The broker's device password file (``broker_credentials``): a decommissioned device's
    #: line is removed from it. None: the service issues no broker passwords.
    device_passwords: Path | None = None
    #: The service's broker connection (``FleetService.broker_status``): ``/healthz``, the
    #: dashboard's banner and its "unknown since" presence read it; None: not known (no banner).
    broker_status: Callable[[], Any] | None = None


_bearer = HTTPBearer(auto_error=False, description="an operator token: edgesdk fleet serve token create")

#: The errors each kind of route documents (all application/problem+json).
_READ_ERRORS = (401, 403, 422)
_ONE_ERRORS = (401, 403, 404, 422)
_WRITE_ERRORS = (401, 403, 404, 409, 422)
MISSING_TOKEN = "no operator token: send Authorization: Bearer <token> (edgesdk fleet serve token create)"
#: Most items one page holds; ``limit`` defaults to DEFAULT_LIMIT.
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route: each status as problem+json."""
    return {
        status: {
            "model": Problem,
            "content": {api_problems.MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


@dataclass(frozen=True)
class Paging:
    limit: int
    offset: int

    def page(self, items: list[Any], total: int | None = None, *, sliced: bool = False) -> dict[str, Any]:
        """The page of ``items`` (all of them, or already this page when ``sliced``)."""
        shown = items if sliced else items[self.offset : self.offset + self.limit]
        return {
            "items": shown,
            "total": len(items) if total is None else total,
            "limit": self.limit,
            "offset": self.offset,
        }


def paging(
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=f"items per page, 1 to {MAX_LIMIT}"),
    offset: int = Query(0, ge=0, le=1 << 31, description="items to skip"),
) -> Paging:
    return Paging(limit, offset)


def create_app(context: ApiContext) -> FastAPI:
    """The API over ``context`` (the dashboard mounts its pages on the same app)."""
    app = FastAPI(
        title="edgesdk fleet service",
        version="1",
        docs_url=None,
        redoc_url=None,
        description="Devices, their history, staged rollouts, enrollment and bundles of one edgesdk fleet. "
        "Errors are RFC 9457 application/problem+json; lists are pages (limit, offset) with a total.",
    )
    from edgesdk.fleet.service.dashboard import SCRIPTS
    from edgesdk.fleet.service.web_security import SecurityHeaders, content_security_policy

    app.add_middleware(SecurityHeaders, policy=content_security_policy(SCRIPTS))
    engine = context.engine
    api_problems.install(app, lambda request, status, detail: _audit_refusal(engine, request, status, detail))

    def who(needed: tokens.Role, action: str) -> Any:
        """A dependency: the operator behind the token; 401 (missing or bad token, each its own
        message) or 403 otherwise. Refused writes reach the audit log through the error handler."""

        def dependency(
            request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
        ) -> tokens.Operator:
            request.state.action = action
            if credentials is None:
                raise HTTPException(401, MISSING_TOKEN, headers={"WWW-Authenticate": "Bearer"})
            operator, why = tokens.identify(engine, credentials.credentials)
            if operator is None:
                raise HTTPException(401, why, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
            request.state.operator = operator
            if not tokens.allows(operator.role, needed):
                raise HTTPException(
                    403, f"{action} needs the {needed} role; token {operator.token_id} is {operator.role}"
                )
            return operator

        return dependency

    _device_routes(app, context, who)
    _deployment_routes(app, context, who)
    _bundle_routes(app, context, who)
    _enrollment_routes(app, context, who)
    _operator_routes(app, context, who)

    metrics = FleetMetrics(engine, broker_status=context.broker_status)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["monitoring"], responses=_errors(401, 403))
    def prometheus_metrics(_op: tokens.Operator = Depends(who("viewer", "metrics.read"))) -> PlainTextResponse:
        """The fleet for Prometheus, with a viewer token (every device id is on the page); or with
        none on a listener of its own (``fleet serve --metrics-listen``)."""
        return PlainTextResponse(metrics.render(), media_type=METRICS_MEDIA_TYPE)

    @app.get("/healthz", response_model=Health, tags=["monitoring"], responses={503: {"model": Health}})
    def healthz() -> JSONResponse:
        """No token: for load balancers and probes. 200 ``ok`` while the service holds its broker
        connection, 503 ``degraded`` while it has lost it."""
        broker = _broker_state(context)
        healthy = broker.get("connected") is not False
        return JSONResponse(
            {"status": "ok" if healthy else "degraded", "broker": broker}, status_code=200 if healthy else 503
        )

    from edgesdk.fleet.service.dashboard import add_dashboard

    add_dashboard(app, context)
    return app


def _audit_refusal(engine: Any, request: Request, status: int, detail: str) -> None:
    """A refused write in the audit log: who (when the token was good), what, on what, why."""
    operator = getattr(request.state, "operator", None)
    action = getattr(request.state, "action", None) or f"{request.method} {request.url.path}"
    target = next(iter(request.path_params.values()), "") if request.path_params else ""
    audit.record(
        engine,
        actor=operator.actor if operator is not None else "anonymous",
        role=operator.role if operator is not None else None,
        action=action,
        target=str(target),
        outcome="refused",
        detail={"status": status, "error": detail[:500]},
    )


def _broker_state(context: ApiContext) -> dict[str, Any]:
    """The service's broker connection as JSON ({} fields unknown when the service has no
    ``broker_status``, e.g. an API without a service around it)."""
    if context.broker_status is None:
        return {"connected": None}
    state = context.broker_status()
    if hasattr(state, "as_dict"):
        return dict(state.as_dict())
    data = asdict(state) if is_dataclass(state) and not isinstance(state, type) else dict(state)
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in data.items()}


# -- devices ----------------------------------------------------------------------------------


def _device_routes(app: FastAPI, context: ApiContext, who: Any) -> None:
    engine = context.engine

    @app.get("/api/v1/devices", response_model=Page[Device], tags=["devices"], responses=_errors(*_READ_ERRORS))
    def list_devices(
        group: str | None = Query(None, max_length=128),
        model: str | None = Query(None, max_length=128),
        version: str | None = Query(None, max_length=64),
        state: DeviceState | None = Query(None, description="online, offline, or the OTA state last reported"),
        page: Paging = Depends(paging),
        _op: tokens.Operator = Depends(who("viewer", "devices.read")),
    ) -> dict[str, Any]:
        rows = _devices(engine, group=group, model=model, version=version, state=state)
        shown = rows[page.offset : page.offset + page.limit]
        latest = _latest_telemetry(engine, [r.device_id for r in shown])
        return page.page([_device(r, latest.get(r.device_id)) for r in shown], len(rows), sliced=True)

    @app.get("/api/v1/devices/{device_id}", response_model=Device, tags=["devices"], responses=_errors(*_ONE_ERRORS))
    def get_device(device_id: str, _op: tokens.Operator = Depends(who("viewer", "devices.read"))) -> Device:
        row = _known_device(engine, device_id)
        return _device(row, _latest_telemetry(engine, [device_id]).get(device_id))

    @app.delete(
        "/api/v1/devices/{device_id}",
        response_model=Decommissioned,
        tags=["devices"],
        responses=_errors(*_WRITE_ERRORS),
    )
    def decommission_device(
        device_id: str, operator: tokens.Operator = Depends(who("admin", "device.decommission"))
    ) -> dict[str, Any]:
        """Decommission: the device's broker password is removed (the broker refuses it from its
        next reload), its enrollment revoked (no key slot in bundles packaged from now on), and
        it leaves the device list (its history stays until retention removes it)."""
        _known_device(engine, device_id)
        return audited_call(
            engine, operator, "device.decommission", device_id, lambda: _decommission(context, device_id)
        )

    @app.get(
        "/api/v1/devices/{device_id}/history",
        response_model=DeviceHistory,
        tags=["devices"],
        responses=_errors(*_ONE_ERRORS),
    )
    def device_history(
        device_id: str,
        hours: float = Query(24.0, gt=0, le=24 * 366),
        resolution: Literal["auto", "raw", "minute"] = "auto",
        _op: tokens.Operator = Depends(who("viewer", "devices.read")),
    ) -> dict[str, Any]:
        _known_device(engine, device_id)
        return _history(engine, device_id, hours, resolution)

    @app.get("/api/v1/groups", response_model=Page[Group], tags=["devices"], responses=_errors(*_READ_ERRORS))
    def list_groups(
        page: Paging = Depends(paging), _op: tokens.Operator = Depends(who("viewer", "devices.read"))
    ) -> dict[str, Any]:
        """Every group a device announced, with how many devices are in it and online."""
        counts: dict[str, list[int]] = {}
        for row in _devices(engine):
            for group in json.loads(row.groups or "[]"):
                count = counts.setdefault(group, [0, 0])
                count[0] += 1
                count[1] += 1 if row.online else 0
        groups = [{"group": g, "devices": n, "online": on} for g, (n, on) in sorted(counts.items())]
        return page.page(groups)

    @app.get("/api/v1/alerts", response_model=Page[Alert], tags=["devices"], responses=_errors(*_READ_ERRORS))
    def list_alerts(
        page: Paging = Depends(paging), _op: tokens.Operator = Depends(who("viewer", "alerts.read"))
    ) -> dict[str, Any]:
        """The alerts the dashboard shows now (offline, heat, aborted rollouts, refused messages)."""
        broker = context.broker_status() if context.broker_status is not None else None
        return page.page(alerts.current_alerts(engine, context.store, broker))


def audited_call(engine: Any, operator: tokens.Operator, action: str, target: str, work: Any, **detail: Any) -> Any:
    return audit.audited(engine, operator, action, target, work, detail)


def _devices(
    engine: Any,
    *,
    group: str | None = None,
    model: str | None = None,
    version: str | None = None,
    state: str | None = None,
) -> list[Any]:
    table = schema.devices
    query = sa.select(table)
    if model is not None:
        query = query.where(table.c.model_name == model)
    if version is not None:
        query = query.where(table.c.model_version == version)
    if state in ("online", "offline"):
        query = query.where(table.c.online.is_(state == "online"))
    elif state is not None:
        query = query.where(table.c.ota_state == state)
    if group is not None:
        query = query.where(table.c.groups.contains(json.dumps(group)))  # JSON text: a quoted name
    with Transaction(engine) as db:
        rows = db.execute(query.order_by(table.c.device_id)).all()
    return [r for r in rows if group is None or group in json.loads(r.groups)]


def _known_device(engine: Any, device_id: str) -> Any:
    table = schema.devices
    with Transaction(engine) as db:
        row = db.execute(sa.select(table).where(table.c.device_id == device_id)).first()
    if row is None:
        raise HTTPException(404, f"device {device_id!r} not known to the fleet service")
    return row


def _latest_telemetry(engine: Any, device_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The newest telemetry row of each of ``device_ids`` (one index seek each)."""
    if not device_ids:
        return {}
    with Transaction(engine) as db:
        rows = db.execute(latest_telemetry().where(schema.devices.c.device_id.in_(device_ids))).all()
    return {r.device_id: dict(r._mapping) for r in rows}


def _history(engine: Any, device_id: str, hours: float, resolution: str) -> dict[str, Any]:
    since = time.time() - hours * 3600
    minute = resolution == "minute" or (resolution == "auto" and hours > 6)
    with Transaction(engine) as db:
        if minute:
            m = schema.telemetry_minutely
            series = db.execute(
                sa.select(m).where((m.c.device_id == device_id) & (m.c.minute >= since)).order_by(m.c.minute)
            ).all()
        else:
            t = schema.telemetry
            series = db.execute(
                sa.select(t).where((t.c.device_id == device_id) & (t.c.ts >= since)).order_by(t.c.ts)
            ).all()
        e = schema.events
        events = db.execute(
            sa.select(e).where((e.c.device_id == device_id) & (e.c.ts >= since)).order_by(e.c.ts.desc()).limit(500)
        ).all()
        h = schema.ota_history
        ota = db.execute(
            sa.select(h).where((h.c.device_id == device_id) & (h.c.ts >= since)).order_by(h.c.ts.desc()).limit(500)
        ).all()
    return {
        "device_id": device_id,
        "resolution": "minute" if minute else "raw",
        "telemetry": [dict(r._mapping) for r in series],
        "events": [{**dict(r._mapping), "detail": json.loads(r.detail)} for r in events],
        "ota": [dict(r._mapping) for r in ota],
    }


def _decommission(context: ApiContext, device_id: str) -> dict[str, Any]:
    from edgesdk.fleet.broker_credentials import DevicePasswordFile
    from edgesdk.fleet.enrollment import RegistryFile

    removed = False
    if context.device_passwords is not None:
        removed = DevicePasswordFile(context.device_passwords).remove(device_id)
    revoked = False
    if context.registry_path is not None and context.registry_path.is_file():
        registry = RegistryFile(context.registry_path)
        if device_id in registry.load().devices:
            registry.revoke(device_id, reason="decommissioned")
            revoked = True
    requests = schema.enrollment_requests
    with Transaction(context.engine) as db:
        revoked = (
            bool(
                db.execute(requests.update().where(requests.c.device_id == device_id).values(status="revoked")).rowcount
            )
            or revoked
        )
        db.execute(schema.devices.delete().where(schema.devices.c.device_id == device_id))
    return {"device_id": device_id, "broker_credentials_removed": removed, "enrollment_revoked": revoked}


def _device(row: Any, latest: dict[str, Any] | None = None) -> Device:
    data = dict(row._mapping)
    data["groups"] = json.loads(data.get("groups") or "[]")
    for name in ("presence_ts", "telemetry_seq", "public_key"):
        data.pop(name, None)
    return Device(**data, latest=latest)


# -- deployments ------------------------------------------------------------------------------


def _deployment_routes(app: FastAPI, context: ApiContext, who: Any) -> None:
    engine, store = context.engine, context.store

    @app.get(
        "/api/v1/deployments",
        response_model=Page[DeploymentSummary],
        tags=["deployments"],
        responses=_errors(*_READ_ERRORS),
    )
    def list_deployments(
        state: RolloutState | None = None,
        page: Paging = Depends(paging),
        _op: tokens.Operator = Depends(who("viewer", "deployments.read")),
    ) -> dict[str, Any]:
        """Newest first."""
        rows = [row for row in reversed(store.all()) if state is None or row.state == state]
        shown = rows[page.offset : page.offset + page.limit]
        return page.page([_summary(store, row.id) for row in shown], len(rows), sliced=True)

    @app.get(
        "/api/v1/deployments/{deployment_id}",
        response_model=DeploymentDetail,
        tags=["deployments"],
        responses=_errors(*_ONE_ERRORS),
    )
    def get_deployment(
        deployment_id: str, _op: tokens.Operator = Depends(who("viewer", "deployments.read"))
    ) -> dict[str, Any]:
        _known_deployment(store, deployment_id)
        return _detail(engine, store, deployment_id)

    @app.get(
        "/api/v1/security-events",
        response_model=Page[dict[str, Any]],
        tags=["deployments"],
        responses=_errors(*_READ_ERRORS),
    )
    def security_events(
        device_id: str | None = Query(None, max_length=64),
        deployment_id: str | None = Query(None, max_length=64),
        page: Paging = Depends(paging),
        _op: tokens.Operator = Depends(who("viewer", "security_events.read")),
    ) -> dict[str, Any]:
        """Device refusals of commands this service did not issue to them, newest first."""
        newest = refusals.recent(
            engine, deployment_id=deployment_id, device_id=device_id, limit=page.offset + page.limit
        )
        table = schema.security_events
        count = sa.select(sa.func.count()).select_from(table)
        if deployment_id is not None:
            count = count.where(table.c.deployment_id == deployment_id)
        if device_id is not None:
            count = count.where(table.c.device_id == device_id)
        with Transaction(engine) as db:
            total = int(db.execute(count).scalar_one())
        return page.page(newest[page.offset :], total, sliced=True)

    @app.post(
        "/api/v1/deployments",
        status_code=201,
        response_model=DeploymentSummary,
        tags=["deployments"],
        responses=_errors(*_WRITE_ERRORS),
    )
    def create_deployment(
        body: DeploymentCreate, operator: tokens.Operator = Depends(who("operator", "deployment.create"))
    ) -> dict[str, Any]:
        """409 for a deployment id already taken; 422 naming every target device the service has
        never seen (a rollout to them could never finish); 404 for an unknown bundle."""
        bundle = bundles.find_bundle(engine, body.bundle_id)
        if bundle is None:
            raise HTTPException(404, f"bundle {body.bundle_id!r} not found; upload it first (POST /api/v1/bundles)")
        if body.deployment_id is not None and store.find(body.deployment_id) is not None:
            raise HTTPException(409, f"deployment {body.deployment_id!r} already exists; pick another deployment_id")
        if body.devices is not None:
            _refuse_unknown_devices(engine, body.devices)
        else:
            _refuse_unknown_group(engine, body.group or "")

        def work() -> Any:
            return submit_deployment(
                store,
                Path(bundle["path"]),
                _plan(body),
                devices=body.devices,
                group=body.group,
                deployment_id=body.deployment_id,
                health=HealthCriteria(
                    probation_s=body.probation_s, p95_latency_ms=body.p95_ms, max_error_rate=body.max_error_rate
                ),
                chunk_size=body.chunk_size,
                artifact_urls=body.artifact_urls,
                mqtt_fallback=body.mqtt_fallback,
            )

        target = body.deployment_id or ""
        message = audited_call(engine, operator, "deployment.create", target, work, **body.model_dump())
        return _summary(store, message.deployment_id)

    def command(
        deployment_id: str, body: CommandOptions | None, operator: tokens.Operator, action: str
    ) -> dict[str, Any]:
        row = _known_deployment(store, deployment_id)
        options = body or CommandOptions()
        if action == "deployment.abort" and row.state in FINISHED_ROLLOUT_STATES:
            raise HTTPException(409, f"deployment {deployment_id!r} already ended {row.state}")
        reason = options.reason or f"{action.split('.')[1]} by {operator.name}"

        def work() -> Any:
            if action == "deployment.abort":
                context.commands.abort(deployment_id, reason, ttl_s=options.expires_s)
                return None
            return context.commands.rollback(deployment_id, reason, ttl_s=options.expires_s)

        asked = audited_call(engine, operator, action, deployment_id, work, reason=reason)
        summary = _summary(store, deployment_id)
        if asked is not None:
            summary["asked"] = asked
        return summary

    @app.post(
        "/api/v1/deployments/{deployment_id}/abort",
        response_model=DeploymentSummary,
        tags=["deployments"],
        responses=_errors(*_WRITE_ERRORS),
    )
    def abort_deployment(
        deployment_id: str,
        body: CommandOptions | None = None,
        operator: tokens.Operator = Depends(who("operator", "deployment.abort")),
    ) -> dict[str, Any]:
        """409 when the deployment already ended."""
        return command(deployment_id, body, operator, "deployment.abort")

    @app.post(
        "/api/v1/deployments/{deployment_id}/rollback",
        response_model=DeploymentSummary,
        tags=["deployments"],
        responses=_errors(*_WRITE_ERRORS),
    )
    def rollback_deployment(
        deployment_id: str,
        body: CommandOptions | None = None,
        operator: tokens.Operator = Depends(who("operator", "deployment.rollback")),
    ) -> dict[str, Any]:
        return command(deployment_id, body, operator, "deployment.rollback")

    # GET and HEAD registered apart: one api_route with both gives the OpenAPI document two
    # operations with the same id (FastAPI warns; schema-driven clients need them unique).
    @app.head("/artifacts/{name}", tags=["artifacts"], operation_id="artifact_head", responses=_errors(404))
    @app.get("/artifacts/{name}", tags=["artifacts"], operation_id="artifact_get", responses=_errors(404))
    def artifact(name: str) -> FileResponse:
        """A bundle of a running rollout, with Range (devices resume with it). No token: devices
        have none, the bundle is encrypted to its devices, and they trust the signed hash, not
        this server; only bundles of rollouts in progress are served, by their sha256."""
        sha, _, suffix = name.partition(".")
        path = context.artifacts(sha) if context.artifacts is not None and suffix == "edgepkg" else None
        if path is None or not path.is_file():
            raise HTTPException(404, f"no bundle {name!r} is being rolled out here")
        return FileResponse(path, media_type="application/octet-stream", filename=f"{sha}.edgepkg")


def _plan(body: DeploymentCreate) -> RolloutPlan:
    return RolloutPlan(
        canary=body.canary,
        waves=tuple(body.waves),
        max_failures=body.max_failures,
        probation_s=body.probation_s,
        wave_timeout_s=body.wave_timeout_s,
        command_ttl_s=body.expires_s,
    )


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
    row = store.find(deployment_id)
    if row is None:
        raise HTTPException(404, f"deployment {deployment_id!r} not found")
    return row


# -- bundles ----------------------------------------------------------------------------------


def _bundle_routes(app: FastAPI, context: ApiContext, who: Any) -> None:
    engine = context.engine

    @app.get("/api/v1/bundles", response_model=Page[Bundle], tags=["bundles"], responses=_errors(*_READ_ERRORS))
    def list_bundles(
        page: Paging = Depends(paging), _op: tokens.Operator = Depends(who("viewer", "bundles.read"))
    ) -> dict[str, Any]:
        """Newest first."""
        return page.page(bundles.public(engine, context.store, bundles.list_bundles(engine)))

    @app.get("/api/v1/bundles/{bundle_id}", response_model=Bundle, tags=["bundles"], responses=_errors(*_ONE_ERRORS))
    def get_bundle(bundle_id: str, _op: tokens.Operator = Depends(who("viewer", "bundles.read"))) -> dict[str, Any]:
        return bundles.public(engine, context.store, [_known_bundle(engine, bundle_id)])[0]

    @app.delete(
        "/api/v1/bundles/{bundle_id}", response_model=Bundle, tags=["bundles"], responses=_errors(*_WRITE_ERRORS)
    )
    def delete_bundle(
        bundle_id: str, operator: tokens.Operator = Depends(who("operator", "bundle.delete"))
    ) -> dict[str, Any]:
        """The bundle and its file; 409 while a deployment that has not ended rolls it out."""
        (shown,) = bundles.public(engine, context.store, [_known_bundle(engine, bundle_id)])
        running = bundles.running_deployments(context.store, shown["sha256"])
        if running:
            raise HTTPException(409, f"bundle {bundle_id!r} is rolled out by {', '.join(running)}: abort them first")
        audited_call(engine, operator, "bundle.delete", bundle_id, lambda: bundles.delete_bundle(engine, bundle_id))
        return shown

    @app.post(
        "/api/v1/bundles",
        status_code=201,
        response_model=Bundle,
        tags=["bundles"],
        responses=_errors(400, 401, 403, 413, 422),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            }
        },
    )
    async def upload_bundle(
        request: Request,
        filename: str = Query("bundle.edgepkg", max_length=255),
        operator: tokens.Operator = Depends(who("operator", "bundle.upload")),
    ) -> dict[str, Any]:
        from starlette.concurrency import run_in_threadpool

        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > context.max_bundle_bytes:
            raise HTTPException(413, f"bundle of {declared} bytes is over the limit of {context.max_bundle_bytes}")
        directory = context.data_dir / "bundles"
        handle, path = bundles.new_upload(directory)
        size = 0
        try:
            with handle:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > context.max_bundle_bytes:
                        raise HTTPException(413, f"bundle is over the limit of {context.max_bundle_bytes} bytes")
                    handle.write(chunk)
                handle.flush()
        except BaseException:
            path.unlink(missing_ok=True)
            raise

        def work() -> Any:
            stored = bundles.store_bundle(engine, directory, filename, path, uploaded_by=operator.actor)
            return bundles.public(engine, context.store, [stored])[0]

        return await run_in_threadpool(audited_call, engine, operator, "bundle.upload", filename, work, size=size)


def _known_bundle(engine: Any, bundle_id: str) -> dict[str, Any]:
    found = bundles.find_bundle(engine, bundle_id)
    if found is None:
        raise HTTPException(404, f"bundle {bundle_id!r} not found (GET /api/v1/bundles lists them)")
    return found


# -- enrollment -------------------------------------------------------------------------------


def _enrollment_routes(app: FastAPI, context: ApiContext, who: Any) -> None:
    engine = context.engine
    table = schema.enrollment_requests

    @app.get(
        "/api/v1/enrollment",
        response_model=Page[EnrollmentRequest],
        tags=["enrollment"],
        responses=_errors(*_READ_ERRORS),
    )
    def list_enrollment(
        status: EnrollmentStatus | None = None,
        page: Paging = Depends(paging),
        _op: tokens.Operator = Depends(who("viewer", "enrollment.read")),
    ) -> dict[str, Any]:
        query = sa.select(table).order_by(table.c.device_id)
        if status is not None:
            query = query.where(table.c.status == status)
        with Transaction(engine) as db:
            return page.page([dict(r._mapping) for r in db.execute(query)])

    def decide(
        device_id: str, approve: bool, body: EnrollmentDecision | None, operator: tokens.Operator
    ) -> dict[str, Any]:
        with Transaction(engine) as db:
            row = db.execute(sa.select(table).where(table.c.device_id == device_id)).first()
        if row is None:
            raise HTTPException(404, f"no enrollment request from device {device_id!r}")
        options = body or EnrollmentDecision()
        action = "enrollment.approve" if approve else "enrollment.revoke"
        answer: dict[str, Any] = {}

        def work() -> Any:
            if approve:
                answer.update(_approve(context, row, options))
                return
            if context.registry_path is not None:
                from edgesdk.fleet.enrollment import RegistryFile

                registry = RegistryFile(context.registry_path)
                if context.registry_path.is_file() and device_id in registry.load().devices:
                    registry.revoke(device_id, reason=options.reason)
            with Transaction(engine) as db:
                db.execute(table.update().where(table.c.device_id == device_id).values(status="revoked"))

        key = (options.key_id or "").lower() or row.key_id
        audited_call(engine, operator, action, device_id, work, key_id=key, reason=options.reason)
        with Transaction(engine) as db:
            current = dict(db.execute(sa.select(table).where(table.c.device_id == device_id)).one()._mapping)
        return {**current, **answer}

    @app.post(
        "/api/v1/enrollment/{device_id}/approve",
        response_model=EnrollmentRequest,
        tags=["enrollment"],
        responses=_errors(400, *_WRITE_ERRORS),
    )
    def approve_enrollment(
        device_id: str,
        body: EnrollmentDecision | None = None,
        operator: tokens.Operator = Depends(who("operator", "enrollment.approve")),
    ) -> dict[str, Any]:
        """409 when ``key_id`` names neither key the device offered, or the key is another device's."""
        return decide(device_id, True, body, operator)

    @app.post(
        "/api/v1/enrollment/{device_id}/revoke",
        response_model=EnrollmentRequest,
        tags=["enrollment"],
        responses=_errors(*_WRITE_ERRORS),
    )
    def revoke_enrollment(
        device_id: str,
        body: EnrollmentDecision | None = None,
        operator: tokens.Operator = Depends(who("admin", "enrollment.revoke")),
    ) -> dict[str, Any]:
        return decide(device_id, False, body, operator)


# -- operators --------------------------------------------------------------------------------


def _operator_routes(app: FastAPI, context: ApiContext, who: Any) -> None:
    engine = context.engine

    @app.get("/api/v1/tokens", response_model=Page[Token], tags=["operators"], responses=_errors(*_READ_ERRORS))
    def list_tokens(
        page: Paging = Depends(paging), _op: tokens.Operator = Depends(who("admin", "tokens.read"))
    ) -> dict[str, Any]:
        return page.page(tokens.list_tokens(engine))

    @app.post(
        "/api/v1/tokens",
        status_code=201,
        response_model=NewToken,
        tags=["operators"],
        responses=_errors(*_WRITE_ERRORS),
    )
    def create_token(
        body: TokenCreate, operator: tokens.Operator = Depends(who("admin", "token.create"))
    ) -> dict[str, Any]:
        token_id, token = audited_call(
            engine,
            operator,
            "token.create",
            body.name,
            lambda: tokens.create_token(engine, name=body.name, role=body.role, created_by=operator.actor),
            role=body.role,
        )
        return {"id": token_id, "token": token, "role": body.role, "name": body.name}

    @app.delete(
        "/api/v1/tokens/{token_id}", response_model=Token, tags=["operators"], responses=_errors(*_WRITE_ERRORS)
    )
    def revoke_token(
        token_id: str, operator: tokens.Operator = Depends(who("admin", "token.revoke"))
    ) -> dict[str, Any]:
        """Revoke a token: every request with it, and every dashboard session it opened, is
        refused from now on. 409 when it is already revoked."""
        found = tokens.find_token(engine, token_id)
        if found is None:
            raise HTTPException(404, f"token {token_id!r} not found (GET /api/v1/tokens lists them)")
        if found["revoked"] is not None:
            raise HTTPException(409, f"token {token_id!r} is already revoked")
        audited_call(engine, operator, "token.revoke", token_id, lambda: tokens.revoke_token(engine, token_id))
        return tokens.find_token(engine, token_id) or found

    @app.get("/api/v1/audit", response_model=Page[AuditEntry], tags=["operators"], responses=_errors(*_READ_ERRORS))
    def audit_log(
        page: Paging = Depends(paging), _op: tokens.Operator = Depends(who("admin", "audit.read"))
    ) -> dict[str, Any]:
        """Newest first."""
        entries = audit.entries(engine, limit=page.limit, offset=page.offset)
        return page.page(entries, audit.count(engine), sliced=True)

    @app.get("/api/v1/stats", response_model=Stats, tags=["operators"], responses=_errors(*_READ_ERRORS))
    def stats(_op: tokens.Operator = Depends(who("viewer", "stats.read"))) -> dict[str, Any]:
        return {"ingest": read_counters(engine, context.store.where)}


METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def create_metrics_app(engine: Any, broker_status: Callable[[], Any] | None = None) -> Any:
    """``GET /metrics`` alone, without a token: for a listener that only the scraper reaches
    (``--metrics-listen``); every other path is 404. A plain ASGI app (no docs, no dashboard)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    from edgesdk.fleet.service.web_security import SecurityHeaders, content_security_policy

    metrics = FleetMetrics(engine, broker_status=broker_status)

    def page(_request: Request) -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=METRICS_MEDIA_TYPE)

    app = Starlette(routes=[Route("/metrics", page, methods=["GET"])])
    app.add_middleware(SecurityHeaders, policy=content_security_policy(()))
    return app


def _approve(context: ApiContext, row: Any, options: EnrollmentDecision) -> dict[str, Any]:
    """Approve the key of ``row`` (an enrollment request) that ``options.key_id`` names in full:
    the key the device requested with, or the other key it offered since. Refused when the id is
    missing or names neither (an approval is bound to the key the operator checked on the device,
    never to whatever key was announced last). Returns what the REST answer adds (warnings)."""
    from edgesdk.fleet.enrollment import RegistryFile, decode_public_key, shared_key_devices

    device_id = row.device_id
    if options.key_id is None:
        raise UsageError(
            f"approving device {device_id!r} needs key_id: the full key id (32 hex digits) the device shows "
            "locally (edge-agent key), checked out of band"
        )
    wanted = options.key_id.lower()
    if wanted == row.key_id:
        public_key, offered = row.public_key, False
    elif row.offered_key_id is not None and wanted == row.offered_key_id:
        public_key, offered = row.offered_public_key, True
    else:
        also = f" (and later offered {row.offered_key_id})" if row.offered_key_id else ""
        raise EnrollmentError(
            f"device {device_id!r} requested enrollment with key id {row.key_id}{also}, not {wanted}: "
            "nothing approved; check the key id the device shows (edge-agent key)"
        )
    shared: list[str] = []
    if context.registry_path is not None:
        registry = RegistryFile(context.registry_path)
        registry.approve(
            device_id,
            decode_public_key(public_key),
            profile=row.profile,
            expect_key_id=wanted,
            replace=options.replace,
            allow_shared_key=options.allow_shared_key,
        )
        shared = shared_key_devices(registry.load(), device_id, wanted)
    table = schema.enrollment_requests
    values: dict[str, Any] = {"status": "approved"}
    if offered:  # the offered key is now the device's key; the one it replaces is forgotten here
        values.update(
            public_key=public_key,
            key_id=wanted,
            offered_public_key=None,
            offered_key_id=None,
            offered_at=None,
        )
    with Transaction(context.engine) as db:
        db.execute(table.update().where(table.c.device_id == device_id).values(**values))
    if not shared:
        return {}
    warning = (
        f"key {wanted} of device {device_id!r} is also approved for {', '.join(shared)} (allowed: allow_shared_key)"
    )
    log.warning("enrollment: %s", warning)
    return {"warnings": [warning]}
