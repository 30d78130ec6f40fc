"""The fleet service's REST API (FastAPI): devices, history, deployments, enrollment, bundles,
tokens, groups, alerts, the audit log and ``/healthz``. This module makes the app, its
authentication and its error answers; the routes are in ``devices``, ``deployments``,
``admin``, ``targeting`` and ``webhooks`` of this package.

Every route but ``/healthz`` and ``/artifacts`` needs an operator token (``Authorization:
Bearer esf_…``); reads need the viewer role, writes operator or admin (see ``tokens``). Every
error is RFC 9457 problem+json (``problems``); every list is a page (``limit``, ``offset``;
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

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from edgesdk.fleet.service import audit, tokens
from edgesdk.fleet.service.metrics import FleetMetrics
from edgesdk.fleet.service.rest import problems
from edgesdk.fleet.service.rest.admin import add_bundle_routes, add_enrollment_routes, add_operator_routes
from edgesdk.fleet.service.rest.deployments import add_deployment_routes
from edgesdk.fleet.service.rest.devices import add_device_routes
from edgesdk.fleet.service.rest.routing import documented
from edgesdk.fleet.service.rest.schemas import Health
from edgesdk.fleet.service.rest.targeting import add_targeting_routes
from edgesdk.fleet.service.store import SqlRolloutStore

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

MISSING_TOKEN = "no operator token: send Authorization: Bearer <token> (edgesdk fleet serve token create)"


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
    problems.install(app, lambda request, status, detail: _audit_refusal(engine, request, status, detail))

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

    add_device_routes(app, context, who)
    add_deployment_routes(app, context, who)
    add_bundle_routes(app, context, who)
    add_enrollment_routes(app, context, who)
    add_operator_routes(app, context, who)
    add_targeting_routes(app, context, who)

    metrics = FleetMetrics(engine, broker_status=context.broker_status)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["monitoring"], responses=documented(401, 403))
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
