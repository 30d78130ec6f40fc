"""The REST API's webhooks (issue 40, admin only): register (the URL checked against SSRF, the
secret never shown back), list, remove, and each one's delivery outcomes. The ``WebhookNotifier``
(``webhooks``) that delivers starts with the first webhook."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from edgesdk.errors import UsageError
from edgesdk.fleet.service import schema, tokens, webhooks
from edgesdk.fleet.service.rest.context import ApiContext, api_context, signed_in
from edgesdk.fleet.service.rest.routing import (
    ONE_ERRORS,
    READ_ERRORS,
    WRITE_ERRORS,
    Paging,
    Route,
    RouteTable,
    audited_call,
    audited_replace,
    paging,
    row_or_404,
)
from edgesdk.fleet.service.rest.schemas import Page


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WebhookCreate(_Body):
    url: str = Field(max_length=2000)
    secret: str = Field(min_length=16, max_length=255, description="signs each payload (HMAC-SHA256); never shown back")
    events: list[str] = Field(
        default_factory=list, max_length=32, description="event prefixes (rollout., alert.firing); empty: every event"
    )
    format: Literal["edgesdk", "alertmanager"] = "edgesdk"


class Webhook(BaseModel):
    id: str
    url: str
    events: list[str]
    format: str
    created: float
    created_by: str


class WebhookDelivery(BaseModel):
    id: int
    webhook_id: str
    event: str
    ts: float
    attempts: int
    outcome: str
    status: int | None
    error: str


def start_notifier(app: FastAPI, context: ApiContext) -> None:
    """The app's ``WebhookNotifier`` (``app.state.webhooks``), started now if a webhook exists."""
    attempts, backoff_s = webhooks.retry_settings()
    app.state.webhooks = webhooks.WebhookNotifier(
        context.engine, context.store, context.broker_status, attempts=attempts, backoff_s=backoff_s
    ).start_if_wanted()


def list_webhooks(page: Paging = Depends(paging), context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    return page.page([webhooks.shown(r) for r in webhooks.all_webhooks(context.engine)])


def create_webhook(
    body: WebhookCreate,
    request: Request,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """422 for a URL that is not http(s) or that resolves to a link-local or metadata address."""
    try:
        webhooks.check_url(body.url)
    except UsageError as exc:
        raise HTTPException(422, str(exc)) from None

    def work() -> dict[str, Any]:
        return webhooks.register(
            context.engine,
            url=body.url,
            secret=body.secret,
            events=body.events,
            fmt=body.format,
            created_by=operator.actor,
        )

    made = audited_call(context.engine, operator, "webhook.create", body.url, work, url=body.url, events=body.events)
    request.app.state.webhooks.start()  # the first webhook starts the watcher and the deliveries
    return made


def list_deliveries(
    webhook_id: str,
    page: Paging = Depends(paging),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """The outcome of each delivery after its last try, newest first."""
    _known_webhook(context.engine, webhook_id)
    return page.page(webhooks.deliveries(context.engine, webhook_id, limit=page.offset + page.limit + 1000))


def delete_webhook(
    webhook_id: str,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """The webhook as it was (its delivery records stay until retention)."""
    removed = _known_webhook(context.engine, webhook_id)
    table = schema.webhooks
    audited_replace(context.engine, operator, "webhook.delete", table, table.c.id, webhook_id, None)
    return removed


_WEBHOOK = "/api/v1/webhooks/{webhook_id}"

ROUTES = RouteTable(
    "webhooks",
    Route("GET", "/api/v1/webhooks", list_webhooks, "admin", "webhooks.read", Page[Webhook], READ_ERRORS),
    Route("POST", "/api/v1/webhooks", create_webhook, "admin", "webhook.create", Webhook, WRITE_ERRORS, status=201),
    Route(
        "GET", _WEBHOOK + "/deliveries", list_deliveries, "admin", "webhooks.read", Page[WebhookDelivery], ONE_ERRORS
    ),
    Route("DELETE", _WEBHOOK, delete_webhook, "admin", "webhook.delete", Webhook, WRITE_ERRORS),
)


def _known_webhook(engine: Any, webhook_id: str) -> dict[str, Any]:
    w = schema.webhooks
    missing = f"webhook {webhook_id!r} not found (GET /api/v1/webhooks lists them)"
    return webhooks.shown(row_or_404(engine, w, w.c.id, webhook_id, missing))
