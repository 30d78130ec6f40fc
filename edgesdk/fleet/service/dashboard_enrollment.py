"""The dashboard's pending enrollment page (``/ui/enrollment``): every request waiting for an
operator with its FULL key id, and approve/reject buttons for the operator role (a viewer sees
the list only).

An approval is bound to the key id the page showed (a hidden field, checked by the same code as
the REST approve): a device that announced another key since is refused, never approved with
whatever key came last. Compare the id with ``edge-agent key`` on the device before approving.
Reject marks a pending request ``revoked`` (nothing was in the registry yet). Both forms carry
the session's CSRF value and are audited like the API's writes.
"""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.service import audit, schema, tokens
from edgesdk.fleet.service.dashboard_ui import PageParts, Pages, Ui, escape, mount_pages, page_parts
from edgesdk.fleet.service.database import Transaction

PAGE = "/ui/enrollment"


def add_enrollment_pages(app: FastAPI, context: Any, ui: Ui) -> None:
    """Mount the enrollment pages on ``app``; their handlers find ``ui`` and ``context`` on it."""
    mount_pages(app, _PARTS, PageParts(ui, context), PAGES)


def enrollment_page(request: Request, error: str = "", done: str = "") -> Response:
    parts = page_parts(request, _PARTS)
    ui, table = parts.ui, schema.enrollment_requests
    operator, session_id = ui.session(request)
    if operator is None:
        return ui.login_redirect()
    with Transaction(parts.context.engine) as db:
        rows = db.execute(sa.select(table).where(table.c.status == "pending").order_by(table.c.requested)).all()
    csrf = ui.csrf_for(session_id) if tokens.allows(operator.role, "operator") else None
    body = (
        "<h1>Pending enrollment</h1>"
        + (f'<p class="bad" id=enrollment-error>{escape(error)}</p>' if error else "")
        + (f'<p class="ok" id=enrollment-done>{escape(done)}</p>' if done else "")
        + "<section><p>Approve a device only after comparing its key id with the one "
        "<code>edge-agent key --config …</code> shows on the device itself: the approval is bound "
        "to the key id shown here.</p>"
        "<table id=pending data-live><tr><th>device</th><th>key id</th><th>profile</th><th>agent</th>"
        f"<th>host</th><th>requested</th><th></th></tr>{''.join(_row(r, csrf) for r in rows)}</table>"
        + ("" if rows else "<p class=empty id=no-pending>No request is waiting.</p>")
        + "</section>"
    )
    return ui.page("enrollment", body, operator)


async def enrollment_decision(request: Request, device_id: str, action: str) -> Response:
    from starlette.concurrency import run_in_threadpool

    parts = page_parts(request, _PARTS)
    ui, context = parts.ui, parts.context
    operator, session_id = ui.session(request)
    fields = await ui.form(request)
    if action not in ("approve", "reject"):
        return ui.page("not found", f"<section><h1>No action {escape(action)}</h1></section>", operator,
                       refresh=False, status_code=404)  # fmt: skip
    verb = f"enrollment.{action}"
    refusal = ui.write_allowed(fields.get("csrf", ""), session_id, operator, verb, device_id)
    if refusal is not None or operator is None:
        return _back(error=refusal or "sign in first")
    key_id = fields.get("key_id", "").lower()
    try:
        work = (lambda: _approve(context, device_id, key_id)) if action == "approve" else (
            lambda: _reject(context.engine, device_id, key_id))  # fmt: skip
        await run_in_threadpool(audit.audited, context.engine, operator, verb, device_id, work, {"key_id": key_id})
    except EdgeSDKError as exc:
        return _back(error=str(exc))
    return _back(done=f"{device_id} {'approved' if action == 'approve' else 'rejected'} (key {key_id})")


#: Where ``mount_pages`` keeps this module's parts on the app.
_PARTS = "enrollment_pages"
PAGES: Pages = (
    ("GET", PAGE, enrollment_page, HTMLResponse),
    ("POST", PAGE + "/{device_id}/{action}", enrollment_decision, None),
)


def _row(r: Any, csrf: str | None) -> str:
    keys = f"<code class=key-id>{escape(r.key_id)}</code>"
    if r.offered_key_id:
        keys += f"<br><span class=warn>also offered</span> <code>{escape(r.offered_key_id)}</code>"
    actions = ""
    if csrf is not None:
        did = escape(r.device_id)
        path = f"{PAGE}/{urllib.parse.quote(r.device_id)}"
        hidden = (
            f'<input type=hidden name=csrf value="{csrf}"><input type=hidden name=key_id value="{escape(r.key_id)}">'
        )
        actions = (
            f'<form class=inline method=post action="{path}/approve">{hidden}'
            f'<button id="approve-{did}">Approve key {escape(r.key_id[:8])}…</button></form> '
            f'<form class=inline method=post action="{path}/reject">{hidden}'
            f'<button class=danger id="reject-{did}">Reject</button></form>'
        )
    requested = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.requested))
    return (
        f'<tr id="pending-{escape(r.device_id)}"><td>{escape(r.device_id)}</td><td>{keys}</td>'
        f"<td>{escape(r.profile)}</td><td>{escape(r.agent_version)}</td><td>{escape(r.hostname)}</td>"
        f"<td>{requested}</td><td>{actions}</td></tr>"
    )


def _back(**message: str) -> RedirectResponse:
    return RedirectResponse(f"{PAGE}?{urllib.parse.urlencode(message)}", status_code=303)


def _pending(engine: Any, device_id: str) -> Any:
    from edgesdk.errors import EnrollmentError

    table = schema.enrollment_requests
    with Transaction(engine) as db:
        row = db.execute(sa.select(table).where(table.c.device_id == device_id)).first()
    if row is None or row.status != "pending":
        raise EnrollmentError(f"no pending enrollment request from device {device_id!r} (decided already?)")
    return row


def _approve(context: Any, device_id: str, key_id: str) -> None:
    """The REST approve's own checks and effects, bound to the key id the page showed."""
    from edgesdk.fleet.service.rest.admin import _approve as approve_key
    from edgesdk.fleet.service.rest.schemas import EnrollmentDecision

    row = _pending(context.engine, device_id)
    if len(key_id) != 32:
        from edgesdk.errors import EnrollmentError

        raise EnrollmentError(f"key id {key_id!r} is not a full key id (32 hex digits); reload the page")
    approve_key(context, row, EnrollmentDecision(key_id=key_id))


def _reject(engine: Any, device_id: str, key_id: str) -> None:
    from edgesdk.errors import EnrollmentError

    row = _pending(engine, device_id)
    if key_id != row.key_id:
        raise EnrollmentError(f"device {device_id!r} now requests with key {row.key_id}, not {key_id}; reload the page")
    table = schema.enrollment_requests
    with Transaction(engine) as db:
        db.execute(
            table.update()
            .where((table.c.device_id == device_id) & (table.c.status == "pending"))
            .values(status="revoked")
        )
