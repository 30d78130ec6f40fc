"""The dashboard's audit log view (``/ui/audit``, the admin role like ``GET /api/v1/audit``):
every write, allowed or refused, newest first, in pages (SQL LIMIT/OFFSET), filtered by actor
and by action (a part of either; ``outcome`` exactly)."""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from edgesdk.fleet.service import schema, tokens
from edgesdk.fleet.service.dashboard_ui import PageParts, Pages, Ui, escape, mount_pages, page_parts
from edgesdk.fleet.service.database import Transaction

PAGE = "/ui/audit"
PER_PAGE = 50
OUTCOMES = ("ok", "refused", "failed")


def find_entries(engine: Any, *, actor: str, action: str, outcome: str, page: int) -> tuple[int, list[Any]]:
    log = schema.audit_log
    clauses = [c for c in (
        log.c.actor.ilike(f"%{actor}%") if actor else None,
        log.c.action.ilike(f"%{action}%") if action else None,
        log.c.outcome == outcome if outcome else None,
    ) if c is not None]  # fmt: skip
    with Transaction(engine) as db:
        total = db.execute(sa.select(sa.func.count()).select_from(log).where(*clauses)).scalar_one()
        rows = db.execute(
            sa.select(log).where(*clauses).order_by(log.c.id.desc()).limit(PER_PAGE).offset((page - 1) * PER_PAGE)
        ).all()
    return total, rows


def add_audit_page(app: FastAPI, context: Any, ui: Ui) -> None:
    """Mount the audit page on ``app``; its handler finds ``ui`` and ``context`` on it."""
    mount_pages(app, _PARTS, PageParts(ui, context), PAGES)


def audit_page(request: Request, actor: str = "", action: str = "", outcome: str = "", page: str = "1") -> Response:
    parts = page_parts(request, _PARTS)
    ui = parts.ui
    operator, _session_id = ui.session(request)
    if operator is None:
        return ui.login_redirect()
    if not tokens.allows(operator.role, "admin"):
        body = f'<h1>Audit log</h1><p class="bad" id=audit-error>the audit log needs the admin role; you are {escape(operator.role)}</p>'
        return ui.page("audit", body, operator, refresh=False, status_code=403)
    bad = _bad(outcome, page)
    if bad:
        body = f'<h1>Audit log</h1><p class="bad" id=audit-error>{escape(bad)}</p><p><a href="{PAGE}">the whole log</a></p>'
        return ui.page("audit", body, operator, refresh=False, status_code=400)
    number = int(page)
    engine = parts.context.engine
    total, rows = find_entries(engine, actor=actor[:128], action=action[:64], outcome=outcome, page=number)
    query = {"actor": actor, "action": action, "outcome": outcome}
    return ui.page("audit", _render(query, number, total, rows), operator)


#: Where ``mount_pages`` keeps this module's parts on the app.
_PARTS = "audit_pages"
PAGES: Pages = (("GET", PAGE, audit_page, HTMLResponse),)


def _bad(outcome: str, page: str) -> str:
    if outcome and outcome not in OUTCOMES:
        return f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}"
    if not page.isdigit() or int(page) < 1:
        return f"page {page!r} is not a whole number from 1"
    return ""


def _render(query: dict[str, str], page: int, total: int, rows: list[Any]) -> str:
    def link(number: int) -> str:
        params = {k: v for k, v in query.items() if v} | ({"page": str(number)} if number > 1 else {})
        return escape(PAGE + ("?" + urllib.parse.urlencode(params) if params else ""))

    pages = max(1, -(-total // PER_PAGE))
    nav = f"<span id=audit-page-info>{total} entries · page {page} of {pages}</span>"
    if page > 1:
        nav = f'<a id=audit-prev href="{link(page - 1)}">← newer</a> ' + nav
    if page < pages:
        nav += f' <a id=audit-next href="{link(page + 1)}">older →</a>'
    options = "".join(f"<option{' selected' if o == query['outcome'] else ''}>{o}</option>" for o in ("", *OUTCOMES))
    form = (
        f'<form method=get action="{PAGE}" id=audit-filters>'
        f'<label>actor <input type=text name=actor id=audit-actor value="{escape(query["actor"])}"></label>'
        f'<label>action <input type=text name=action id=audit-action value="{escape(query["action"])}"></label>'
        f"<label>outcome <select name=outcome id=audit-outcome>{options}</select></label>"
        "<button type=submit id=audit-apply>Apply</button></form>"
    )
    cells = "".join(
        f"<tr class=audit-entry><td>{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.ts))}</td>"
        f"<td class=actor>{escape(r.actor)}</td><td>{escape(r.role)}</td><td class=action>{escape(r.action)}</td>"
        f"<td>{escape(r.target)}</td><td class=outcome>{escape(r.outcome)}</td>"
        f"<td><code>{escape(_detail(r.detail))}</code></td></tr>"
        for r in rows
    )
    return (
        f"<h1>Audit log</h1><section>{form}</section><section><p>{nav}</p><table id=audit>"
        "<tr><th>time</th><th>actor</th><th>role</th><th>action</th><th>target</th><th>outcome</th><th>detail</th></tr>"
        f"{cells}</table></section>"
    )


def _detail(text: str) -> str:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return text
    return "" if value == {} else json.dumps(value, sort_keys=True)[:300]
