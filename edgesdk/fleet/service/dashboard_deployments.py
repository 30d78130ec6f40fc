"""The dashboard's rollout pages: a rollout (``/ui/deployments/{id}``: waves with their
progress, per-device state and reason, timeline, refusals that did not count; abort and roll back
for operators), starting one from the overview's form (``POST /ui/deployments``: a bad value is
a 422 with the form again, ``rollout_form``) and the bundle upload behind it (``POST
/ui/bundles``, streamed, size-limited; ``UPLOAD_JS`` sends it, allowed by hash in the CSP)."""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from edgesdk.errors import EdgeSDKError
from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES
from edgesdk.fleet.service import audit, bundles, refusals, schema, tokens
from edgesdk.fleet.service.dashboard_rollout import agreement_notes, canary_note, wave_progress
from edgesdk.fleet.service.dashboard_ui import (
    PageParts,
    Pages,
    Ui,
    escape,
    mount_pages,
    not_found,
    page_parts,
    state_badge,
)
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.rollout_form import FieldError, plan_from, rollout_form
from edgesdk.fleet.service.submit import submit_deployment

UPLOAD_JS = """
document.getElementById('upload-form').addEventListener('submit',function(ev){
  ev.preventDefault();
  var file=document.getElementById('bundle-file').files[0];if(!file)return;
  var csrf=this.getAttribute('data-csrf');
  var status=document.getElementById('upload-status');status.textContent='uploading…';
  fetch('/ui/bundles?filename='+encodeURIComponent(file.name),{method:'POST',body:file,
    headers:{'X-CSRF':csrf,'Content-Type':'application/octet-stream'}})
   .then(function(r){return r.json().then(function(j){if(!r.ok)throw new Error(j.detail);return j;});})
   .then(function(j){status.textContent='uploaded '+j.model_name+' '+j.model_version;location.reload();})
   .catch(function(e){status.textContent='refused: '+e.message;});
});
"""
UPLOAD = f"<script>{UPLOAD_JS}</script>"


def add_deployment_pages(app: FastAPI, context: Any, ui: Ui) -> None:
    """Mount the rollout pages on ``app``; their handlers find ``ui`` and ``context`` on it."""
    mount_pages(app, _PARTS, PageParts(ui, context), PAGES)


def _parts(request: Request) -> tuple[Ui, Any]:
    """The dashboard's ``Ui`` and the API's context, kept on the app by ``add_deployment_pages``."""
    parts = page_parts(request, _PARTS)
    return parts.ui, parts.context


def deployment_page(request: Request, deployment_id: str, error: str = "") -> Response:
    ui, context = _parts(request)
    operator, token = ui.session(request)
    if operator is None:
        return ui.login_redirect()
    store = context.store
    row = store.find(deployment_id)
    if row is None:
        return ui.page("not found", not_found("deployment", deployment_id), operator, refresh=False, status_code=404)
    summary = store.summary(deployment_id)
    devices = store.devices(deployment_id)
    buttons = _buttons(row, devices, ui.csrf_for(token)) if tokens.allows(operator.role, "operator") else ""
    message = f'<p class="bad">{escape(error)}</p>' if error else ""
    plan = row.plan
    body = (
        f"<h1>Rollout {escape(deployment_id)}</h1>{message}<section id=rollout-head data-live>"
        f"<p>State: <b id=rollout-state>{state_badge(row.state)}</b> · {escape(summary['model'])} · "
        f"{summary['devices']} devices · canary {plan.get('canary', 0):.0%} · waves "
        f"{escape(', '.join(f'{w:.0%}' for w in plan.get('waves', [])))} · max failures {plan.get('max_failures', 0):.0%} · "
        f"probation {plan.get('probation_s', 0):g} s</p>"
        f"{canary_note(plan, len(devices))}<p id=rollout-reason>{escape(row.reason) if row.reason else ''}</p>{buttons}</section>"
        f"<section id=waves data-live>{_wave_sections(context.engine, row, devices)}</section>"
        f"<section><h2>Timeline</h2><table id=timeline data-live><tr><th>time</th><th>device</th><th>state</th><th>reason</th></tr>{_timeline(context.engine, deployment_id)}</table></section>"
    )
    return ui.page(deployment_id, body + _ignored_refusals(context.engine, deployment_id), operator)


async def deployment_action(request: Request, deployment_id: str, action: str) -> Response:
    from starlette.concurrency import run_in_threadpool

    ui, context = _parts(request)
    operator, token = ui.session(request)
    fields = await ui.form(request)
    if action not in ("abort", "rollback"):
        return ui.page("not found", not_found("action", action), operator, refresh=False, status_code=404)
    verb = f"deployment.{action}"
    refusal = ui.write_allowed(fields.get("csrf", ""), token, operator, verb, deployment_id)
    target = f"/ui/deployments/{urllib.parse.quote(deployment_id)}"
    if refusal is not None or operator is None:
        return RedirectResponse(f"{target}?error={urllib.parse.quote(refusal or 'sign in first')}", status_code=303)
    reason = f"{action} by {operator.name} (dashboard)"

    def work() -> Any:
        if action == "abort":
            return context.commands.abort(deployment_id, reason)
        return context.commands.rollback(deployment_id, reason)

    try:
        await run_in_threadpool(audit.audited, context.engine, operator, verb, deployment_id, work, {"reason": reason})
    except EdgeSDKError as exc:
        return RedirectResponse(f"{target}?error={urllib.parse.quote(str(exc))}", status_code=303)
    return RedirectResponse(target, status_code=303)


async def new_deployment(request: Request) -> Response:
    from starlette.concurrency import run_in_threadpool

    ui, context = _parts(request)
    engine = context.engine
    operator, token = ui.session(request)
    fields = await ui.form(request)
    refusal = ui.write_allowed(fields.get("csrf", ""), token, operator, "deployment.create", "")
    if refusal is not None or operator is None:
        return ui.page("refused", f'<section><p class="bad">{escape(refusal)}</p></section>', operator, refresh=False)
    try:
        bundle = _bundle(engine, fields.get("bundle_id", ""))
        plan, health, devices, group = plan_from(fields)
        message = await run_in_threadpool(
            audit.audited,
            engine,
            operator,
            "deployment.create",
            "",
            lambda: submit_deployment(context.store, _path(bundle), plan, devices=devices, group=group, health=health),
            {k: v for k, v in fields.items() if k != "csrf"},
        )
    except (EdgeSDKError, ValueError) as exc:
        # The form again, as typed, the reason beside the field it is about (or above it).
        field = exc.field if isinstance(exc, FieldError) else ""
        kept = {k: v for k, v in fields.items() if k != "csrf"}
        again = rollout_form(bundles.list_bundles(engine), ui.csrf_for(token), kept, {field: str(exc)}) + UPLOAD
        title = '<section><h1>Rollout not started</h1><p><a href="/">back to the overview</a></p></section>'
        return ui.page("refused", title + again, operator, refresh=False, status_code=422)
    return RedirectResponse(f"/ui/deployments/{urllib.parse.quote(message.deployment_id)}", status_code=303)


async def upload(request: Request, filename: str = "bundle.edgepkg") -> Response:
    from starlette.concurrency import run_in_threadpool

    ui, context = _parts(request)
    engine = context.engine
    operator, token = ui.session(request)
    refusal = ui.write_allowed(request.headers.get("x-csrf", ""), token, operator, "bundle.upload", filename)
    if refusal is not None or operator is None:
        return JSONResponse({"detail": refusal}, status_code=403)
    directory = context.data_dir / "bundles"
    handle, path = bundles.new_upload(directory)
    size = 0
    with handle:
        async for chunk in request.stream():
            size += len(chunk)
            if size > context.max_bundle_bytes:
                handle.close()
                path.unlink(missing_ok=True)
                return JSONResponse({"detail": "bundle over the size limit"}, status_code=413)
            handle.write(chunk)
    try:
        stored = await run_in_threadpool(
            audit.audited,
            engine,
            operator,
            "bundle.upload",
            filename,
            lambda: bundles.store_bundle(engine, directory, filename, path, uploaded_by=operator.actor),
            {"size": size},
        )
    except EdgeSDKError as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    return JSONResponse(stored, status_code=201)


#: The rollout pages, in the order they are registered (none in the OpenAPI document).
#: Where ``mount_pages`` keeps this module's parts on the app.
_PARTS = "deployment_pages"
PAGES: Pages = (
    ("GET", "/ui/deployments/{deployment_id}", deployment_page, HTMLResponse),
    ("POST", "/ui/deployments/{deployment_id}/{action}", deployment_action, None),
    ("POST", "/ui/deployments", new_deployment, None),
    ("POST", "/ui/bundles", upload, None),
)


def _wave_sections(engine: Any, row: Any, devices: list[Any]) -> str:
    """One section per wave (the canary named so): its progress and each device's state and reason."""
    waves = sorted({d.wave for d in devices})
    agreement = agreement_notes(engine, devices, row.message.model_name)
    sections = ""
    for wave in waves:
        members = [d for d in devices if d.wave == wave]
        name = "canary" if wave == 0 and len(waves) > 1 and row.plan.get("canary", 0) > 0 else f"wave {wave}"
        current = " (current)" if wave == row.wave and row.state not in FINISHED_ROLLOUT_STATES else ""
        cells = "".join(
            f'<tr id="dd-{escape(d.device_id)}"><td><a href="/ui/devices/{escape(d.device_id)}">{escape(d.device_id)}</a></td>'
            f"<td class=state>{_device_state(d.state, row.state)}</td>"
            f"<td>{'' if d.progress is None else f'{d.progress:.0%}'}</td>"
            f"<td>{escape(d.model_release)}</td><td class=reason>{escape(_device_reason(d, row.state))}{agreement.get(d.device_id, '')}</td></tr>"
            for d in members
        )
        sections += (
            f"<h2>{escape(name)}{current}</h2>{wave_progress(members, float(row.plan.get('probation_s', 0)))}"
            f"<table class=wave><tr><th>device</th><th>state</th><th>progress</th>"
            f"<th>release</th><th>reason</th></tr>{cells}</table>"
        )
    return sections


def _timeline(engine: Any, deployment_id: str) -> str:
    """The rollout's OTA states as the devices reported them, oldest first (progress ticks left out)."""
    with Transaction(engine) as db:
        h = schema.ota_history
        timeline = db.execute(
            sa.select(h).where((h.c.deployment_id == deployment_id) & h.c.progress.is_(None)).order_by(h.c.ts)
        ).all()
    return "".join(
        f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(t.ts))}</td><td>{escape(t.device_id)}</td><td>{state_badge(t.state)}</td><td>{escape(t.reason)}</td></tr>"
        for t in timeline
    )


def _ignored_refusals(engine: Any, deployment_id: str) -> str:
    """Refusals quoting this deployment that did not count (copies someone else published); "" for none."""
    ignored = "".join(
        f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(r['ts']))}</td><td>{escape(r['device_id'])}</td>"
        f"<td>{escape(r['kind'])}</td><td>{escape((r['command_sha256'] or '')[:12])}</td><td>{escape(r['reason'])}</td></tr>"
        for r in refusals.recent(engine, deployment_id=deployment_id, limit=50)
    )
    if not ignored:
        return ""
    return (
        "<section><h2>Security events: refusals not counted</h2><p>Devices refused commands naming this "
        "deployment that this service did not issue to them; the rollout ignored them.</p>"
        "<table id=security-events><tr><th>time</th><th>device</th><th>kind</th><th>digest</th>"
        f"<th>reason</th></tr>{ignored}</table></section>"
    )


def _buttons(row: Any, devices: list[Any], csrf: str) -> str:
    """An operator's abort (while the rollout runs) and roll back (once it reached a device)."""
    buttons = ""
    deployment_id = row.id
    if row.state not in FINISHED_ROLLOUT_STATES:
        buttons += (
            f'<form class=inline method=post action="/ui/deployments/{escape(deployment_id)}/abort">'
            f'<input type=hidden name=csrf value="{csrf}"><button class="danger" id="abort">Abort</button></form> '
        )
    # A rollout that ended without reaching a device has nothing to roll back.
    reached = any(d.state != "PENDING" for d in devices)
    if row.state != "ROLLED_BACK" and (reached or row.state not in FINISHED_ROLLOUT_STATES):
        buttons += (
            f'<form class=inline method=post action="/ui/deployments/{escape(deployment_id)}/rollback">'
            f'<input type=hidden name=csrf value="{csrf}"><button class="danger" id="rollback">Roll back</button></form>'
        )
    return buttons


def _device_state(state: str, rollout_state: str) -> str:
    """A device still PENDING in a rollout that ended was never sent anything: say so."""
    if state == "PENDING" and rollout_state in FINISHED_ROLLOUT_STATES:
        return '<span class="idle">NOT SENT</span>'
    return state_badge(state)


def _device_reason(device: Any, rollout_state: str) -> str | None:
    if device.state == "PENDING" and rollout_state in FINISHED_ROLLOUT_STATES and not device.reason:
        return f"the rollout was {rollout_state.lower().replace('_', ' ')} before this wave"
    return device.reason


def _bundle(engine: Any, bundle_id: str) -> dict[str, Any]:
    """The chosen bundle; a FieldError beside the bundle field when there is none."""
    if not bundle_id:
        raise FieldError("bundle_id", "upload a bundle first, then choose it here")
    try:
        return bundles.get_bundle(engine, bundle_id)
    except EdgeSDKError as exc:
        raise FieldError("bundle_id", str(exc)) from None


def _path(bundle: dict[str, Any]) -> Any:
    from pathlib import Path

    return Path(bundle["path"])
