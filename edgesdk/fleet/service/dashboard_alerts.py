"""The dashboard's alerts (``/ui/alerts``, and the overview's Alerts box): the conditions
``alerts.current_alerts`` reads, each with an Acknowledge button for the operator role.

An acknowledgement (table ``alert_acks``) names one occurrence of an alert: its kind, target and
when it began (``since``; the message where there is none), so an aborted rollout acknowledged
once stays acknowledged, and a device that comes back and goes offline again is a new alert.
An acknowledged alert stays listed, grey, with who acknowledged it and when, until its
condition ends. The form carries the session's CSRF value; the write is audited.
"""

from __future__ import annotations

import hashlib
import time
import urllib.parse
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from edgesdk.fleet.service import audit, schema, tokens
from edgesdk.fleet.service.alerts import current_alerts
from edgesdk.fleet.service.dashboard_ui import PageParts, Pages, Ui, escape, mount_pages, page_parts
from edgesdk.fleet.service.database import Transaction

PAGE = "/ui/alerts"
#: Alerts about one device: their line links to its page (drift and data quality: its charts).
_DEVICE_KINDS = ("offline", "thermal", "model_drift", "model_nonfinite", "model_out_of_range")


def alert_key(alert: dict[str, Any]) -> str:
    """The name of one occurrence of ``alert`` (stable while its condition lasts)."""
    began = f"{alert['since']:.3f}" if alert["since"] is not None else alert["message"]
    text = f"{alert['kind']}:{alert['target']}:{began}"
    return text if len(text) <= 255 else text[:190] + ":" + hashlib.sha256(text.encode()).hexdigest()


def alerts_with_acks(engine: Any, store: Any, broker: Any) -> list[tuple[dict[str, Any], str, Any]]:
    """Every current alert with its key and its acknowledgement (None if not acknowledged)."""
    found = [(a, alert_key(a)) for a in current_alerts(engine, store, broker)]
    acks = schema.alert_acks
    with Transaction(engine) as db:
        rows = db.execute(sa.select(acks).where(acks.c.alert_key.in_([k for _a, k in found]))).all() if found else []
    by_key = {r.alert_key: r for r in rows}
    return [(a, k, by_key.get(k)) for a, k in found]


def alert_items(engine: Any, store: Any, broker: Any, csrf: str | None) -> str:
    """The ``<li>`` of each alert (unacknowledged first), or one saying there is none."""
    listed = sorted(alerts_with_acks(engine, store, broker), key=lambda x: x[2] is not None)
    return "".join(_item(a, k, ack, csrf) for a, k, ack in listed) or "<li class=ok>none</li>"


def _item(alert: dict[str, Any], key: str, ack: Any, csrf: str | None) -> str:
    target = escape(alert["target"])
    link = (
        f'/ui/deployments/{target}' if alert["kind"] == "rollout_aborted"
        else f"/ui/devices/{target}" if alert["kind"] in _DEVICE_KINDS else ""
    )  # fmt: skip
    text = f'<a href="{link}">{escape(alert["message"])}</a>' if link else escape(alert["message"])
    anchor = f"alert-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if ack is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(ack.acked_at))
        return (
            f'<li class="idle acked" id="{anchor}" data-kind="{escape(alert["kind"])}">{text} '
            f"<span class=ack>acknowledged by {escape(ack.acked_by)} at {when}</span></li>"
        )
    css = "bad" if alert["severity"] == "critical" else "warn"
    button = ""
    if csrf is not None:
        button = (
            f' <form class=inline method=post action="{PAGE}/ack"><input type=hidden name=csrf value="{csrf}">'
            f'<input type=hidden name=key value="{escape(key)}"><button class=ack-button>Acknowledge</button></form>'
        )
    return f'<li class="{css}" id="{anchor}" data-kind="{escape(alert["kind"])}">{text}{button}</li>'


def add_alerts_page(app: FastAPI, context: Any, ui: Ui, broker: Any) -> None:
    """Mount the alerts page on ``app``; its handlers find ``ui``, ``context`` and ``broker`` on it."""
    mount_pages(app, _PARTS, PageParts(ui, context, broker), PAGES)


def alerts_page(request: Request, error: str = "") -> Response:
    parts = page_parts(request, _PARTS)
    ui, context = parts.ui, parts.context
    operator, session_id = ui.session(request)
    if operator is None:
        return ui.login_redirect()
    csrf = ui.csrf_for(session_id) if tokens.allows(operator.role, "operator") else None
    message = f'<p class="bad" id=alerts-error>{escape(error)}</p>' if error else ""
    body = (
        f"<h1>Alerts</h1>{message}<section><ul class=alerts id=alerts data-live>"
        f"{alert_items(context.engine, context.store, parts.broker(), csrf)}</ul></section>"
    )
    return ui.page("alerts", body, operator)


async def acknowledge(request: Request) -> Response:
    from starlette.concurrency import run_in_threadpool

    parts = page_parts(request, _PARTS)
    ui, engine, store = parts.ui, parts.context.engine, parts.context.store
    operator, session_id = ui.session(request)
    fields = await ui.form(request)
    key = fields.get("key", "")[:255]
    refusal = ui.write_allowed(fields.get("csrf", ""), session_id, operator, "alert.ack", key)
    if refusal is None and operator is not None:
        current = {k for _a, k, _ack in await run_in_threadpool(alerts_with_acks, engine, store, parts.broker())}
        if key not in current:
            refusal = "that alert has ended or changed since the page was drawn; nothing acknowledged"
        else:
            await run_in_threadpool(
                audit.audited, engine, operator, "alert.ack", key, lambda: _ack(engine, key, operator)
            )
    target = PAGE + (f"?error={urllib.parse.quote(refusal)}" if refusal else "")
    return RedirectResponse(target, status_code=303)


#: Where ``mount_pages`` keeps this module's parts on the app.
_PARTS = "alerts_pages"
PAGES: Pages = (
    ("GET", PAGE, alerts_page, HTMLResponse),
    ("POST", PAGE + "/ack", acknowledge, None),
)


def _ack(engine: Any, key: str, operator: tokens.Operator) -> None:
    acks = schema.alert_acks
    with Transaction(engine) as db:
        if db.execute(sa.select(acks.c.alert_key).where(acks.c.alert_key == key)).first() is None:
            db.execute(acks.insert().values(alert_key=key, acked_by=operator.actor, acked_at=time.time()))
