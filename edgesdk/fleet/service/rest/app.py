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
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from edgesdk.fleet.service import audit
from edgesdk.fleet.service.metrics import FleetMetrics
from edgesdk.fleet.service.rest import admin, deployments, devices, problems, targeting, webhooks
from edgesdk.fleet.service.rest.context import ApiContext, RolloutCommands, api_context
from edgesdk.fleet.service.rest.routing import Route, RouteTable, add_routes
from edgesdk.fleet.service.rest.schemas import Health

__all__ = ["ApiContext", "RolloutCommands", "create_app", "create_metrics_app"]

log = logging.getLogger(__name__)


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
    from edgesdk.fleet.service.dashboard import SCRIPTS, add_dashboard
    from edgesdk.fleet.service.web_security import SecurityHeaders, content_security_policy

    app.add_middleware(SecurityHeaders, policy=content_security_policy(SCRIPTS))
    engine = context.engine
    problems.install(app, lambda request, status, detail: _audit_refusal(engine, request, status, detail))
    app.state.api_context = context
    app.state.fleet_metrics = FleetMetrics(engine, broker_status=context.broker_status)
    webhooks.start_notifier(app, context)
    for table in ROUTE_TABLES:
        add_routes(app, table)
    add_dashboard(app, context)
    return app


def prometheus_metrics(request: Request) -> PlainTextResponse:
    """The fleet for Prometheus, with a viewer token (every device id is on the page); or with
    none on a listener of its own (``fleet serve --metrics-listen``)."""
    return PlainTextResponse(request.app.state.fleet_metrics.render(), media_type=METRICS_MEDIA_TYPE)


def healthz(context: ApiContext = Depends(api_context)) -> JSONResponse:
    """No token: for load balancers and probes. 200 ``ok`` while the service holds its broker
    connection, 503 ``degraded`` while it has lost it."""
    broker = _broker_state(context)
    healthy = broker.get("connected") is not False
    return JSONResponse(
        {"status": "ok" if healthy else "degraded", "broker": broker}, status_code=200 if healthy else 503
    )


MONITORING_ROUTES = RouteTable(
    "monitoring",
    Route(
        "GET",
        "/metrics",
        prometheus_metrics,
        "viewer",
        "metrics.read",
        errors=(401, 403),
        options={"response_class": PlainTextResponse},
    ),
    Route("GET", "/healthz", healthz, None, "", Health, responses={503: {"model": Health}}),
)

#: Every route of the API, part by part, in the order they are registered.
ROUTE_TABLES = (
    devices.ROUTES,
    deployments.ROUTES,
    deployments.ARTIFACT_ROUTES,
    admin.BUNDLE_ROUTES,
    admin.ENROLLMENT_ROUTES,
    admin.OPERATOR_ROUTES,
    targeting.ROUTES,
    webhooks.ROUTES,
    MONITORING_ROUTES,
)


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
