"""The dashboard's artifacts page (``/ui/artifacts``): every uploaded bundle with its size, the
model it carries, the rollouts that use it (running ones marked: the bundle cannot be deleted
while they run) and how many devices report running that model release."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from edgesdk.fleet.service import bundles, schema
from edgesdk.fleet.service.dashboard_ui import PageParts, Pages, Ui, escape, mount_pages, page_parts
from edgesdk.fleet.service.database import Transaction

PAGE = "/ui/artifacts"


def add_artifacts_page(app: FastAPI, context: Any, ui: Ui) -> None:
    """Mount the artifacts page on ``app``; its handler finds ``ui`` and ``context`` on it."""
    mount_pages(app, _PARTS, PageParts(ui, context), PAGES)


def artifacts_page(request: Request) -> Response:
    parts = page_parts(request, _PARTS)
    ui, engine, store = parts.ui, parts.context.engine, parts.context.store
    operator, _session_id = ui.session(request)
    if operator is None:
        return ui.login_redirect()
    shown = bundles.public(engine, store, bundles.list_bundles(engine))
    d = schema.devices
    with Transaction(engine) as db:
        running = db.execute(
            sa.select(d.c.model_name, d.c.model_release, sa.func.count()).group_by(d.c.model_name, d.c.model_release)
        ).all()
    devices = {(name, release): n for name, release, n in running}
    rows = "".join(_row(b, devices.get((b["model_name"], b["model_release"]), 0), store) for b in shown)
    body = (
        "<h1>Artifacts</h1><section><table id=artifacts><tr><th>bundle</th><th>file</th><th>size</th>"
        f"<th>model</th><th>uploaded</th><th>rollouts</th><th>devices running it</th></tr>{rows}</table>"
        + (
            ""
            if shown
            else "<p class=empty id=no-artifacts>No bundle uploaded yet (the overview's form, or "
            "<code>POST /api/v1/bundles</code>).</p>"
        )  # fmt: skip
        + "</section>"
    )
    return ui.page("artifacts", body, operator)


#: Where ``mount_pages`` keeps this module's parts on the app.
_PARTS = "artifacts_pages"
PAGES: Pages = (("GET", PAGE, artifacts_page, HTMLResponse),)


def _row(bundle: dict[str, Any], devices: int, store: Any) -> str:
    live = set(bundles.running_deployments(store, bundle["sha256"]))
    users = ", ".join(
        f'<a href="/ui/deployments/{escape(d)}">{escape(d)}</a>' + (" <b class=warn>running</b>" if d in live else "")
        for d in bundle["in_use_by"]
    )
    uploaded = time.strftime("%Y-%m-%d %H:%M", time.localtime(bundle["uploaded"]))
    return (
        f'<tr id="artifact-{escape(bundle["id"])}"><td><code>{escape(bundle["id"])}</code></td>'
        f"<td>{escape(bundle['filename'])}</td><td class=size>{_size(bundle['size'])}</td>"
        f"<td>{escape(bundle['model_name'])} {escape(bundle['model_version'])} (release {bundle['model_release']})</td>"
        f"<td>{uploaded} by {escape(bundle['uploaded_by'])}</td><td class=users>{users or '-'}</td>"
        f"<td class=devices>{devices}</td></tr>"
    )


def _size(size: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size:.1f} GiB"
