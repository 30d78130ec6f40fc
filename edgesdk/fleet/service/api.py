"""The fleet service's REST API (FastAPI): devices, history, deployments, enrollment, bundles.

Every route needs an operator token (``Authorization: Bearer esf_…``); reads need the viewer
role, writes operator or admin (see ``tokens``). Every write — allowed, refused for a missing
token or a too-small role, or failed — is written to the audit log. The app gets the
database and a ``RolloutCommands`` port (the service's rollout controller, which signs and
publishes abort/rollback commands; a stand-in in unit tests). No CDN: the interactive docs
pages (which load scripts from one) are off; the OpenAPI document is at ``/openapi.json``.
Every answer carries the security headers of ``web_security`` (CSP, frame-ancestors, nosniff,
Referrer-Policy). ``/metrics`` needs a viewer token here; ``create_metrics_app`` serves it
without one, for a listener of its own that only the scraper reaches (``--metrics-listen``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from edgesdk.errors import EdgeSDKError, EnrollmentError, FleetServiceError, UsageError
from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES
from edgesdk.fleet.rollout import RolloutPlan
from edgesdk.fleet.service import audit, bundles, refusals, schema, tokens
from edgesdk.fleet.service.api_schemas import (
    CommandOptions,
    DeploymentCreate,
    Device,
    DeviceList,
    EnrollmentDecision,
    TokenCreate,
)
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.ingest import read_counters
from edgesdk.fleet.service.metrics import FleetMetrics
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
    #: The service's broker connection (``FleetService.broker_status``): ``/healthz``, the
    #: dashboard's banner and its "unknown since" presence read it; None: not known (no banner).
    broker_status: Callable[[], Any] | None = None


_bearer = HTTPBearer(auto_error=False, description="an operator token: edgesdk fleet serve token create")


def create_app(context: ApiContext) -> FastAPI:
    """The API over ``context`` (the dashboard mounts its pages on the same app)."""
    app = FastAPI(
        title="edgesdk fleet service",
        version="1",
        docs_url=None,
        redoc_url=None,
        description="Devices, their history, staged rollouts, enrollment and bundles of one edgesdk fleet.",
    )
    from edgesdk.fleet.service.dashboard import SCRIPTS
    from edgesdk.fleet.service.web_security import SecurityHeaders, content_security_policy

    app.add_middleware(SecurityHeaders, policy=content_security_policy(SCRIPTS))
    engine = context.engine

    def who(needed: tokens.Role, action: str) -> Any:
        """A dependency: the operator behind the token, refusing (and auditing) otherwise."""

        def dependency(
            request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
        ) -> tokens.Operator:
            operator = tokens.authenticate(engine, credentials.credentials) if credentials else None
            write = request.method not in ("GET", "HEAD")
            target = request.path_params.get("item", "") or ""
            if operator is None:
                if write:
                    audit.record(engine, actor="anonymous", role=None, action=action, target=target, outcome="refused")
                raise HTTPException(401, "an operator token is required", headers={"WWW-Authenticate": "Bearer"})
            if not tokens.allows(operator.role, needed):
                if write:
                    audit.record(
                        engine,
                        actor=operator.actor,
                        role=operator.role,
                        action=action,
                        target=target,
                        outcome="refused",
                    )
                raise HTTPException(
                    403, f"{action} needs the {needed} role; token {operator.token_id} is {operator.role}"
                )
            return operator

        return dependency

    def audited(operator: tokens.Operator, action: str, target: str, work: Any, **detail: Any) -> Any:
        return audit.audited(engine, operator, action, target, work, detail)

    @app.exception_handler(EdgeSDKError)
    def _edgesdk_error(_request: Request, exc: EdgeSDKError) -> JSONResponse:
        status = 409 if isinstance(exc, EnrollmentError) else 503 if isinstance(exc, FleetServiceError) else 400
        return JSONResponse({"detail": str(exc)}, status_code=status)

    @app.exception_handler(RequestValidationError)
    def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each bad input, and a NaN or Infinity (Python's JSON parser
        # reads them) cannot be written back as JSON: the 422 became a 500.
        return JSONResponse({"detail": _json_safe(jsonable_encoder(exc.errors()))}, status_code=422)

    # -- devices ----------------------------------------------------------------------------

    @app.get("/api/v1/devices", response_model=DeviceList, tags=["devices"])
    def list_devices(
        group: str | None = None,
        model: str | None = None,
        version: str | None = None,
        state: str | None = Query(None, description="online, offline, or an OTA state (COMMITTED, FAILED, …)"),
        limit: int = Query(1000, ge=1, le=10000),
        offset: int = Query(0, ge=0, le=1 << 31),
        _op: tokens.Operator = Depends(who("viewer", "devices.read")),
    ) -> DeviceList:
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
        rows = [r for r in rows if group is None or group in json.loads(r.groups)]
        page = rows[offset : offset + limit]
        return DeviceList(devices=[_device(r) for r in page], total=len(rows))

    @app.get("/api/v1/devices/{item}", response_model=Device, tags=["devices"])
    def get_device(item: str, _op: tokens.Operator = Depends(who("viewer", "devices.read"))) -> Device:
        table = schema.devices
        with Transaction(engine) as db:
            row = db.execute(sa.select(table).where(table.c.device_id == item)).first()
            if row is None:
                raise HTTPException(404, f"device {item!r} not known to the fleet service")
            t = schema.telemetry
            latest = db.execute(sa.select(t).where(t.c.device_id == item).order_by(t.c.ts.desc()).limit(1)).first()
        return _device(row, dict(latest._mapping) if latest is not None else None)

    @app.get("/api/v1/devices/{item}/history", tags=["devices"])
    def device_history(
        item: str,
        hours: float = Query(24.0, gt=0, le=24 * 366),
        resolution: str = Query("auto", pattern="^(auto|raw|minute)$"),
        _op: tokens.Operator = Depends(who("viewer", "devices.read")),
    ) -> dict[str, Any]:
        since = time.time() - hours * 3600
        minute = resolution == "minute" or (resolution == "auto" and hours > 6)
        with Transaction(engine) as db:
            if (
                db.execute(sa.select(schema.devices.c.device_id).where(schema.devices.c.device_id == item)).first()
                is None
            ):
                raise HTTPException(404, f"device {item!r} not known to the fleet service")
            if minute:
                m = schema.telemetry_minutely
                series = db.execute(
                    sa.select(m).where((m.c.device_id == item) & (m.c.minute >= since)).order_by(m.c.minute)
                ).all()
            else:
                t = schema.telemetry
                series = db.execute(
                    sa.select(t).where((t.c.device_id == item) & (t.c.ts >= since)).order_by(t.c.ts)
                ).all()
            e = schema.events
            events = db.execute(
                sa.select(e).where((e.c.device_id == item) & (e.c.ts >= since)).order_by(e.c.ts.desc()).limit(500)
            ).all()
            h = schema.ota_history
            ota = db.execute(
                sa.select(h).where((h.c.device_id == item) & (h.c.ts >= since)).order_by(h.c.ts.desc()).limit(500)
            ).all()
        return {
            "device_id": item,
            "resolution": "minute" if minute else "raw",
            "telemetry": [dict(r._mapping) for r in series],
            "events": [{**dict(r._mapping), "detail": json.loads(r.detail)} for r in events],
            "ota": [dict(r._mapping) for r in ota],
        }

    # -- deployments ------------------------------------------------------------------------

    @app.get("/api/v1/deployments", tags=["deployments"])
    def list_deployments(_op: tokens.Operator = Depends(who("viewer", "deployments.read"))) -> list[dict[str, Any]]:
        return [context.store.summary(row.id) for row in reversed(context.store.all())]

    @app.get("/api/v1/deployments/{item}", tags=["deployments"])
    def get_deployment(item: str, _op: tokens.Operator = Depends(who("viewer", "deployments.read"))) -> dict[str, Any]:
        _known_deployment(context.store, item)
        summary = context.store.summary(item)
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
            for d in context.store.devices(item)
        ]
        with Transaction(engine) as db:
            h = schema.ota_history
            rows = db.execute(sa.select(h).where(h.c.deployment_id == item).order_by(h.c.ts)).all()
        summary["timeline"] = [
            {"ts": r.ts, "device_id": r.device_id, "state": r.state, "reason": r.reason}
            for r in rows
            if r.progress is None  # progress ticks are not events of the timeline
        ]
        # Refusals quoting this deployment's id that did not count (forged or replayed copies).
        summary["security_events"] = refusals.recent(engine, deployment_id=item)
        return summary

    @app.get("/api/v1/security-events", tags=["deployments"])
    def security_events(
        device_id: str | None = None,
        deployment_id: str | None = None,
        limit: int = Query(100, gt=0, le=1000),
        _op: tokens.Operator = Depends(who("viewer", "security_events.read")),
    ) -> list[dict[str, Any]]:
        """Device refusals of commands this service did not issue to them, newest first."""
        return refusals.recent(engine, deployment_id=deployment_id, device_id=device_id, limit=limit)

    @app.post("/api/v1/deployments", status_code=201, tags=["deployments"])
    def create_deployment(
        body: DeploymentCreate, operator: tokens.Operator = Depends(who("operator", "deployment.create"))
    ) -> dict[str, Any]:
        bundle = bundles.find_bundle(engine, body.bundle_id)
        if bundle is None:
            raise HTTPException(404, f"bundle {body.bundle_id!r} not found; upload it first (POST /api/v1/bundles)")
        plan = RolloutPlan(
            canary=body.canary,
            waves=tuple(body.waves),
            max_failures=body.max_failures,
            probation_s=body.probation_s,
            wave_timeout_s=body.wave_timeout_s,
            command_ttl_s=body.expires_s,
        )
        health = HealthCriteria(
            probation_s=body.probation_s, p95_latency_ms=body.p95_ms, max_error_rate=body.max_error_rate
        )

        def work() -> Any:
            return submit_deployment(
                context.store,
                Path(bundle["path"]),
                plan,
                devices=body.devices,
                group=body.group,
                deployment_id=body.deployment_id,
                health=health,
                chunk_size=body.chunk_size,
                artifact_urls=body.artifact_urls,
                mqtt_fallback=body.mqtt_fallback,
            )

        message = audited(operator, "deployment.create", body.deployment_id or "", work, **body.model_dump())
        return context.store.summary(message.deployment_id)

    def _command(item: str, body: CommandOptions | None, operator: tokens.Operator, action: str) -> dict[str, Any]:
        row = _known_deployment(context.store, item)
        options = body or CommandOptions()
        if action == "deployment.abort" and row.state in FINISHED_ROLLOUT_STATES:
            raise HTTPException(409, f"deployment {item!r} already ended {row.state}")
        reason = options.reason or f"{action.split('.')[1]} by {operator.name}"

        def work() -> Any:
            if action == "deployment.abort":
                context.commands.abort(item, reason, ttl_s=options.expires_s)
                return None
            return context.commands.rollback(item, reason, ttl_s=options.expires_s)

        asked = audited(operator, action, item, work, reason=reason)
        summary = context.store.summary(item)
        if asked is not None:
            summary["asked"] = asked
        return summary

    @app.post("/api/v1/deployments/{item}/abort", tags=["deployments"])
    def abort_deployment(
        item: str,
        body: CommandOptions | None = None,
        operator: tokens.Operator = Depends(who("operator", "deployment.abort")),
    ) -> dict[str, Any]:
        return _command(item, body, operator, "deployment.abort")

    @app.post("/api/v1/deployments/{item}/rollback", tags=["deployments"])
    def rollback_deployment(
        item: str,
        body: CommandOptions | None = None,
        operator: tokens.Operator = Depends(who("operator", "deployment.rollback")),
    ) -> dict[str, Any]:
        return _command(item, body, operator, "deployment.rollback")

    # -- artifacts (devices) ----------------------------------------------------------------

    # GET and HEAD registered apart: one api_route with both gives the OpenAPI document two
    # operations with the same id (FastAPI warns; schema-driven clients need them unique).
    @app.head("/artifacts/{name}", tags=["artifacts"], operation_id="artifact_head")
    @app.get("/artifacts/{name}", tags=["artifacts"], operation_id="artifact_get")
    def artifact(name: str) -> FileResponse:
        """A bundle of a running rollout, with Range (devices resume with it). No token: devices
        have none, the bundle is encrypted to its devices, and they trust the signed hash, not
        this server; only bundles of rollouts in progress are served, by their sha256."""
        sha, _, suffix = name.partition(".")
        path = context.artifacts(sha) if context.artifacts is not None and suffix == "edgepkg" else None
        if path is None or not path.is_file():
            raise HTTPException(404, f"no bundle {name!r} is being rolled out here")
        return FileResponse(path, media_type="application/octet-stream", filename=f"{sha}.edgepkg")

    # -- bundles ----------------------------------------------------------------------------

    @app.get("/api/v1/bundles", tags=["bundles"])
    def list_bundles(_op: tokens.Operator = Depends(who("viewer", "bundles.read"))) -> list[dict[str, Any]]:
        return bundles.list_bundles(engine)

    @app.post(
        "/api/v1/bundles",
        status_code=201,
        tags=["bundles"],
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
            return bundles.store_bundle(engine, directory, filename, path, uploaded_by=operator.actor)

        return await run_in_threadpool(audited, operator, "bundle.upload", filename, work, size=size)

    # -- enrollment -------------------------------------------------------------------------

    @app.get("/api/v1/enrollment", tags=["enrollment"])
    def list_enrollment(_op: tokens.Operator = Depends(who("viewer", "enrollment.read"))) -> list[dict[str, Any]]:
        table = schema.enrollment_requests
        with Transaction(engine) as db:
            return [dict(r._mapping) for r in db.execute(sa.select(table).order_by(table.c.device_id))]

    def _decide(item: str, approve: bool, body: EnrollmentDecision | None, operator: tokens.Operator) -> dict[str, Any]:
        table = schema.enrollment_requests
        with Transaction(engine) as db:
            row = db.execute(sa.select(table).where(table.c.device_id == item)).first()
        if row is None:
            raise HTTPException(404, f"no enrollment request from device {item!r}")
        options = body or EnrollmentDecision()
        action = "enrollment.approve" if approve else "enrollment.revoke"
        answer: dict[str, Any] = {}

        def work() -> Any:
            if approve:
                answer.update(_approve(context, row, options))
            else:
                if context.registry_path is not None:
                    from edgesdk.fleet.enrollment import RegistryFile

                    RegistryFile(context.registry_path).revoke(item, reason=options.reason)
                with Transaction(engine) as db:
                    db.execute(table.update().where(table.c.device_id == item).values(status="revoked"))

        key = (options.key_id or "").lower() or row.key_id
        audited(operator, action, item, work, key_id=key, reason=options.reason)
        with Transaction(engine) as db:
            current = dict(db.execute(sa.select(table).where(table.c.device_id == item)).one()._mapping)
        return {**current, **answer}

    @app.post("/api/v1/enrollment/{item}/approve", tags=["enrollment"])
    def approve_enrollment(
        item: str,
        body: EnrollmentDecision | None = None,
        operator: tokens.Operator = Depends(who("operator", "enrollment.approve")),
    ) -> dict[str, Any]:
        return _decide(item, True, body, operator)

    @app.post("/api/v1/enrollment/{item}/revoke", tags=["enrollment"])
    def revoke_enrollment(
        item: str,
        body: EnrollmentDecision | None = None,
        operator: tokens.Operator = Depends(who("admin", "enrollment.revoke")),
    ) -> dict[str, Any]:
        return _decide(item, False, body, operator)

    # -- operators --------------------------------------------------------------------------

    @app.get("/api/v1/tokens", tags=["operators"])
    def list_tokens(_op: tokens.Operator = Depends(who("admin", "tokens.read"))) -> list[dict[str, Any]]:
        return tokens.list_tokens(engine)

    @app.post("/api/v1/tokens", status_code=201, tags=["operators"])
    def create_token(
        body: TokenCreate, operator: tokens.Operator = Depends(who("admin", "token.create"))
    ) -> dict[str, Any]:
        token_id, token = audited(
            operator,
            "token.create",
            body.name,
            lambda: tokens.create_token(engine, name=body.name, role=body.role, created_by=operator.actor),
            role=body.role,
        )
        return {"id": token_id, "token": token, "role": body.role, "name": body.name}

    @app.get("/api/v1/audit", tags=["operators"])
    def audit_log(
        limit: int = Query(200, ge=1, le=5000), _op: tokens.Operator = Depends(who("admin", "audit.read"))
    ) -> list[dict[str, Any]]:
        return audit.entries(engine, limit=limit)

    metrics = FleetMetrics(engine, broker_status=context.broker_status)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["monitoring"])
    def prometheus_metrics(_op: tokens.Operator = Depends(who("viewer", "metrics.read"))) -> PlainTextResponse:
        """The fleet for Prometheus, with a viewer token (every device id is on the page); or with
        none on a listener of its own (``fleet serve --metrics-listen``)."""
        return PlainTextResponse(metrics.render(), media_type=METRICS_MEDIA_TYPE)

    from edgesdk.fleet.service.dashboard import add_dashboard

    add_dashboard(app, context)

    @app.get("/api/v1/stats", tags=["operators"])
    def stats(_op: tokens.Operator = Depends(who("viewer", "stats.read"))) -> dict[str, Any]:
        return {"ingest": read_counters(engine, context.store.where)}

    return app


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


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as its text (``"nan"``, ``"inf"``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


def _known_deployment(store: SqlRolloutStore, deployment_id: str) -> Any:
    row = store.find(deployment_id)
    if row is None:
        raise HTTPException(404, f"deployment {deployment_id!r} not found")
    return row


def _device(row: Any, latest: dict[str, Any] | None = None) -> Device:
    data = dict(row._mapping)
    data["groups"] = json.loads(data.get("groups") or "[]")
    for name in ("presence_ts", "telemetry_seq", "public_key"):
        data.pop(name, None)
    return Device(**data, latest=latest)
