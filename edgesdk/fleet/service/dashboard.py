"""The web dashboard, served by the service next to its API: server-rendered HTML, inline SVG
charts (``charts``), a few lines of JavaScript (live updates by server-sent events, the bundle upload), nothing from
a CDN.

Pages: the fleet at a glance (``/``), a device (``/ui/devices/{id}``: latency p50/p95/p99,
temperature, precision and power over time, events, OTA history, the model and its hash), a
rollout (``/ui/deployments/{id}``: waves, per-device state and reason, timeline, abort and
rollback for operators). Signing in makes a server-side session (``tokens.create_session``):
the cookie holds its random id, never the operator token, and is HttpOnly, SameSite=Strict, and
Secure when the dashboard is reached over https (``--public-url https://…`` behind a TLS proxy).
The sign-in form carries a CSRF value paired with a cookie of its own (a page of another site
cannot sign a browser into someone else's session); every form that writes carries a CSRF
value derived from the session id, and every write is audited like the API's. The only
scripts are two constants (``dashboard_live.LIVE_JS``, ``dashboard_deployments.UPLOAD_JS``),
allowed by hash in the Content-Security-Policy (``web_security``).

This module has the frame, signing in, the overview and the device page; each other page group
is a module of its own, handed what it needs as a ``dashboard_ui.Ui``: rollouts
(``dashboard_deployments``), devices (``dashboard_devices``), enrollment, alerts, artifacts,
audit, and the live event stream (``dashboard_live``).
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import secrets
import time
import urllib.parse
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from edgesdk.fleet.service import audit, bundles, schema, tokens
from edgesdk.fleet.service.broker_watch import BrokerStatus, presence_label
from edgesdk.fleet.service.charts import line_chart, state_band
from edgesdk.fleet.service.dashboard_alerts import add_alerts_page, alert_items
from edgesdk.fleet.service.dashboard_artifacts import add_artifacts_page
from edgesdk.fleet.service.dashboard_audit import add_audit_page
from edgesdk.fleet.service.dashboard_deployments import UPLOAD, UPLOAD_JS, add_deployment_pages
from edgesdk.fleet.service.dashboard_devices import add_devices_page, capture_list, quality_charts
from edgesdk.fleet.service.dashboard_enrollment import add_enrollment_pages
from edgesdk.fleet.service.dashboard_live import LIVE_JS, add_live_events
from edgesdk.fleet.service.dashboard_ui import Ui
from edgesdk.fleet.service.dashboard_ui import not_found as _not_found
from edgesdk.fleet.service.dashboard_ui import state_badge as _state
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.metrics import latest_telemetry
from edgesdk.fleet.service.rollout_form import rollout_form

COOKIE = "edgesdk_fleet_session"
#: The sign-in form's CSRF cookie (double submit: the form's hidden value must match it).
LOGIN_COOKIE = "edgesdk_fleet_login"

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#111;background:#f5f5f4}
header{background:#1f2937;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#fff;text-decoration:none}header .who{margin-left:auto;opacity:.8}
main{padding:16px;max-width:1200px}section{background:#fff;border:1px solid #e5e5e5;border-radius:6px;
padding:12px 16px;margin-bottom:16px}h1{font-size:20px;margin:0 0 12px}h2{font-size:16px;margin:0 0 8px}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #eee;padding:4px 8px;text-align:left;
vertical-align:top}th{font-weight:600;background:#fafafa}.ok{color:#15803d;font-weight:600}
.bad{color:#b91c1c;font-weight:600}.idle{color:#6b7280}.warn{color:#b45309;font-weight:600}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border:1px solid #e5e5e5;border-radius:6px;
padding:10px 14px;min-width:140px}.card b{font-size:22px;display:block}.chart{margin:8px 0}
.chart figcaption{font-weight:600}.axis{font-size:10px;fill:#555}.band{font-size:11px;fill:#111}
.empty{color:#6b7280}code{font-size:12px}form.inline{display:inline}button{padding:4px 10px}
.danger{background:#b91c1c;color:#fff;border:0;border-radius:4px}label{margin-right:12px}
input[type=text],input[type=number]{width:110px}.alerts li{margin:2px 0}
.banner{background:#fef3c7;border:1px solid #b45309;border-radius:6px;padding:8px 12px;font-weight:600}
"""

# The page's only scripts: constant texts, so the Content-Security-Policy allows them by hash
# (SCRIPTS) and nothing else runs — no inline handler, no script a stored value could inject.
# LIVE_JS (dashboard_live) swaps the [data-live] parts of a page when the server says they changed.


SCRIPTS = (LIVE_JS, UPLOAD_JS)
_LIVE = f"<script>{LIVE_JS}</script>"


#: Rows of the overview's device table; the devices page has them all, in pages.
_OVERVIEW_DEVICES = 50
_NAV = "".join(f'<a href="/ui/{page}">{page}</a>' for page in ("devices", "enrollment", "alerts", "artifacts", "audit"))


def csrf_for(session_id: str) -> str:
    """The CSRF value of a session: derived from its (secret, random) id, so it needs no more state."""
    return hashlib.sha256(f"edgesdk-fleet-csrf:{session_id}".encode()).hexdigest()[:32]


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value))


def _ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    seconds = max(0.0, now - ts)
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def _page(
    title: str,
    body: str,
    operator: tokens.Operator | None,
    *,
    refresh: bool = True,
    banner: str = "",
    status_code: int = 200,
) -> HTMLResponse:
    who = (
        f'<span class="who">{_e(operator.name)} ({_e(operator.role)}) · <a href="/logout">sign out</a></span>'
        if operator is not None
        else ""
    )
    return HTMLResponse(
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)} — edgesdk fleet</title>"
        f'<meta name="viewport" content="width=device-width"><style>{_STYLE}</style></head><body>'
        f'<header><a href="/"><b>edgesdk fleet</b></a><a href="/">overview</a>{_NAV}{who}</header>'
        f"<main><div id=live-banner data-live>{banner}</div>{body}</main>"
        f"{_LIVE if refresh and operator is not None else ''}</body></html>",
        status_code=status_code,
    )


def _broker_banner(status: BrokerStatus | None) -> str:
    """A banner on every page while the service cannot see its broker (or re-learns presence)."""
    if status is None or status.presence_known():
        return ""
    since = status.since.astimezone().strftime("%H:%M:%S")
    if not status.connected:
        return (
            f'<p class="banner" id="broker-banner">The fleet service lost its MQTT broker at {since}: device '
            "presence is unknown (not offline) until it is back; no offline alerts meanwhile.</p>"
        )
    return (
        f'<p class="banner" id="broker-banner">The MQTT broker is back since {since}: re-learning device presence; '
        "devices not yet heard from are shown as unknown.</p>"
    )


class DashboardShell:
    """What every page of the dashboard needs, over the API's context: the frame around a page
    (with the broker banner), who is signed in, the write check and the form parser. Kept on
    the app as ``app.state.dashboard``; the page modules get it as a ``dashboard_ui.Ui``."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.engine = context.engine
        self.store = context.store

    def broker(self) -> BrokerStatus | None:
        source = getattr(self.context, "broker_status", None)
        return source() if source is not None else None

    def page(
        self, title: str, body: str, operator: tokens.Operator | None, *, refresh: bool = True, status_code: int = 200
    ) -> HTMLResponse:
        banner = _broker_banner(self.broker())
        return _page(title, body, operator, refresh=refresh, banner=banner, status_code=status_code)

    def session(self, request: Request) -> tuple[tokens.Operator | None, str]:
        session_id = request.cookies.get(COOKIE, "")
        return (tokens.session_operator(self.engine, session_id) if session_id else None), session_id

    def secure(self, request: Request) -> bool:
        """Whether cookies get ``Secure``: served over https, or behind an https --public-url."""
        public_url = getattr(self.context, "public_url", None) or ""
        return request.url.scheme == "https" or public_url.startswith("https://")

    @staticmethod
    def login_redirect() -> RedirectResponse:
        return RedirectResponse("/login", status_code=303)

    @staticmethod
    async def form(request: Request) -> dict[str, str]:
        body = (await request.body()).decode("utf-8", "replace")
        return {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True).items()}

    def write_allowed(
        self, request_csrf: str, token: str, operator: tokens.Operator | None, action: str, target: str
    ) -> str | None:
        """None when the write may go ahead; else why not (and the refusal is audited)."""
        engine = self.engine
        if operator is None:
            audit.record(engine, actor="anonymous", role=None, action=action, target=target, outcome="refused")
            return "sign in first"
        if not token or not hmac.compare_digest(request_csrf, csrf_for(token)):
            audit.record(
                engine,
                actor=operator.actor,
                role=operator.role,
                action=action,
                target=target,
                outcome="refused",
                detail={"why": "csrf"},
            )
            return "the form is stale or was not sent by this dashboard; reload the page"
        if not tokens.allows(operator.role, "operator"):
            audit.record(
                engine, actor=operator.actor, role=operator.role, action=action, target=target, outcome="refused"
            )
            return f"{action} needs the operator role; you are {operator.role}"
        return None

    def ui(self) -> Ui:
        return Ui(self.page, self.session, self.write_allowed, self.form, self.login_redirect, csrf_for)


def add_dashboard(app: FastAPI, context: Any) -> None:
    """Mount the dashboard's pages on ``app`` (the API's app, same database and controller)."""
    shell = DashboardShell(context)
    app.state.dashboard = shell
    add_live_events(app, context, lambda request: request.cookies.get(COOKIE, ""), shell.broker)
    ui = shell.ui()
    add_enrollment_pages(app, context, ui)
    add_devices_page(app, context, ui, shell.broker)
    add_alerts_page(app, context, ui, shell.broker)
    add_audit_page(app, context, ui)
    add_artifacts_page(app, context, ui)
    add_deployment_pages(app, context, ui)
    for method, path, handler, response_class in PAGES:
        chosen: dict[str, Any] = {} if response_class is None else {"response_class": response_class}
        app.add_api_route(path, handler, methods=[method], include_in_schema=False, **chosen)


def _shell(request: Request) -> DashboardShell:
    shell: DashboardShell = request.app.state.dashboard
    return shell


# -- signing in -------------------------------------------------------------------------


def login_page(request: Request, error: str = "") -> HTMLResponse:
    shell = _shell(request)
    message = f'<p class="bad">{_e(error)}</p>' if error else ""
    login_csrf = secrets.token_urlsafe(24)
    body = (
        f"<section><h1>Sign in</h1>{message}<form method=post action=/login>"
        f'<input type=hidden name=csrf value="{login_csrf}">'
        "<label>Operator token <input type=password name=token id=token size=60 autofocus></label>"
        "<button type=submit id=sign-in>Sign in</button></form>"
        "<p class=idle>Tokens come from <code>edgesdk fleet serve token create --role …</code>.</p></section>"
    )
    response = shell.page("sign in", body, None, refresh=False)
    response.set_cookie(
        LOGIN_COOKIE, login_csrf, httponly=True, samesite="strict", secure=shell.secure(request), max_age=3600
    )
    return response


async def login(request: Request) -> Response:
    shell = _shell(request)
    fields = await shell.form(request)
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(fields.get("csrf", ""), expected):
        # Not this dashboard's sign-in form (another site posting a token of its choosing).
        audit.record(
            shell.engine,
            actor="anonymous",
            role=None,
            action="dashboard.login",
            outcome="refused",
            detail={"why": "csrf"},
        )
        return RedirectResponse("/login?error=" + urllib.parse.quote("the sign-in form expired; try again"), 303)
    token = fields.get("token", "").strip()
    operator = tokens.authenticate(shell.engine, token) if token else None
    if operator is None:
        audit.record(shell.engine, actor="anonymous", role=None, action="dashboard.login", outcome="refused")
        return RedirectResponse("/login?error=" + urllib.parse.quote("unknown or revoked token"), status_code=303)
    audit.record(shell.engine, actor=operator.actor, role=operator.role, action="dashboard.login")
    session_id = tokens.create_session(shell.engine, operator.token_id)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        COOKIE,
        session_id,
        httponly=True,
        samesite="strict",
        secure=shell.secure(request),
        max_age=int(tokens.SESSION_TTL_S),
    )
    response.delete_cookie(LOGIN_COOKIE)
    return response


def logout(request: Request) -> Response:
    shell = _shell(request)
    session_id = request.cookies.get(COOKIE, "")
    if session_id:
        tokens.end_session(shell.engine, session_id)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE)
    return response


# -- the fleet at a glance --------------------------------------------------------------


def overview(request: Request) -> Response:
    shell = _shell(request)
    operator, token = shell.session(request)
    if operator is None:
        return shell.login_redirect()
    now = time.time()
    with Transaction(shell.engine) as db:
        devices = db.execute(sa.select(schema.devices).order_by(schema.devices.c.device_id)).all()
        latest = {r.device_id: r for r in db.execute(latest_telemetry()).all()}
    newest, _total = shell.store.newest_page(limit=20, offset=0)
    deployments = [shell.store.summary(row.id) for row in newest]
    status = shell.broker()
    presence = {d.device_id: presence_label(d.online, status) for d in devices}
    online = sum(1 for p in presence.values() if p == "online")
    offline = sum(1 for p in presence.values() if p == "offline")
    versions: dict[str, int] = {}
    for d in devices:
        key = f"{d.model_name or 'no model'} {d.model_version or ''}".strip()
        versions[key] = versions.get(key, 0) + 1
    cards = (
        f'<div class="cards" id="cards" data-live><div class="card" id="online">online<b>{online}</b></div>'
        f'<div class="card" id="offline">offline<b>{offline}</b></div>'
        + (
            f'<div class="card" id="unknown">unknown<b>{len(devices) - online - offline}</b></div>'
            if online + offline < len(devices)
            else ""
        )
        + "".join(f'<div class="card">{_e(k)}<b>{v}</b></div>' for k, v in sorted(versions.items()))
        + "</div>"
    )
    can_write = tokens.allows(operator.role, "operator")
    alerts = alert_items(shell.engine, shell.store, status, csrf_for(token) if can_write else None)
    rows = "".join(
        f'<tr id="device-{_e(d.device_id)}"><td><a href="/ui/devices/{_e(d.device_id)}">{_e(d.device_id)}</a></td>'
        f"<td class=presence>{_presence(presence[d.device_id])}</td>"
        f"<td>{_e(d.model_name)} {_e(d.model_version)}</td><td>{_e(d.precision)}</td><td>{_state(d.ota_state)}</td>"
        f"<td>{_e(_fmt(latest.get(d.device_id), 'p95_ms'))}</td><td>{_e(_fmt(latest.get(d.device_id), 'temperature_c'))}</td>"
        f"<td>{_e(', '.join(json.loads(d.groups)))}</td><td>{_ago(d.last_seen, now)}</td></tr>"
        for d in devices[:_OVERVIEW_DEVICES]
    )
    if len(devices) > _OVERVIEW_DEVICES:
        rows += (
            f'<tr><td colspan=9><a href="/ui/devices">all {len(devices)} devices: search, filter, sort</a></td></tr>'
        )
    rollouts = "".join(
        f'<tr><td><a href="/ui/deployments/{_e(d["deployment_id"])}">{_e(d["deployment_id"])}</a></td>'
        f"<td>{_state(d['state'])}</td><td>{_e(d['model'])}</td><td>{d['devices']}</td>"
        f"<td>{_e(', '.join(f'{k} {v}' for k, v in sorted(d['by_state'].items())))}</td></tr>"
        for d in deployments
    )
    body = (
        f"<h1>Fleet</h1>{cards}{'' if devices else _no_devices_hint(str(request.base_url).rstrip('/'))}"
        f"<section><h2>Alerts</h2><ul class=alerts id=alerts data-live>{alerts}</ul>"
        '<p><a href="/ui/alerts">all alerts</a></p></section>'
        "<section><h2>Devices</h2><table id=devices data-live><tr><th>device</th><th>presence</th><th>model</th><th>precision</th>"
        f"<th>OTA</th><th>p95 ms</th><th>°C</th><th>groups</th><th>seen</th></tr>{rows}</table></section>"
        "<section><h2>Rollouts</h2><table id=rollouts data-live><tr><th>deployment</th><th>state</th><th>model</th><th>devices</th>"
        f"<th>by state</th></tr>{rollouts}</table></section>"
    )
    if tokens.allows(operator.role, "operator"):
        body += rollout_form(bundles.list_bundles(shell.engine), csrf_for(token)) + UPLOAD
    return shell.page("overview", body, operator)


# -- a device ---------------------------------------------------------------------------


def device_page(request: Request, device_id: str, hours: float = 6.0) -> Response:
    shell = _shell(request)
    operator, _token = shell.session(request)
    if operator is None:
        return shell.login_redirect()
    now = time.time()
    since = now - min(max(hours, 0.1), 24 * 31) * 3600
    with Transaction(shell.engine) as db:
        row = db.execute(sa.select(schema.devices).where(schema.devices.c.device_id == device_id)).first()
        if row is None:
            return shell.page("not found", _not_found("device", device_id), operator, refresh=False, status_code=404)
        t = schema.telemetry
        raw = db.execute(sa.select(t).where((t.c.device_id == device_id) & (t.c.ts >= since)).order_by(t.c.ts)).all()
        e = schema.events
        events = db.execute(sa.select(e).where(e.c.device_id == device_id).order_by(e.c.ts.desc()).limit(50)).all()
        h = schema.ota_history
        ota = db.execute(
            sa.select(h).where((h.c.device_id == device_id) & h.c.progress.is_(None)).order_by(h.c.ts.desc()).limit(50)
        ).all()
    latency = line_chart(
        {
            "p50": [(r.ts, r.p50_ms) for r in raw if r.p50_ms is not None],
            "p95": [(r.ts, r.p95_ms) for r in raw if r.p95_ms is not None],
            "p99": [(r.ts, r.p99_ms) for r in raw if r.p99_ms is not None],
        },
        unit="ms",
        title="latency",
    )
    temperature = line_chart(
        {"hottest sensor": [(r.ts, r.temperature_c) for r in raw if r.temperature_c is not None]},
        unit="°C",
        title="temperature",
    )
    precision = state_band([(r.ts, r.precision) for r in raw], title="precision")
    power = state_band([(r.ts, r.power_source) for r in raw], title="power source")
    governor = state_band([(r.ts, r.governor_state) for r in raw], title="governor")
    facts = [
        ("presence", presence_label(row.online, shell.broker())),
        ("model", f"{row.model_name or '-'} {row.model_version or ''} (release {row.model_release or '-'})"),
        ("variant", row.variant),
        ("precision / runtime", f"{row.precision or '-'} / {row.runtime or '-'}"),
        ("model sha256", row.model_sha256),
        ("profile / agent", f"{row.profile or '-'} / {row.agent_version or '-'}"),
        ("groups", ", ".join(json.loads(row.groups))),
        ("last OTA", f"{row.ota_state or '-'} ({row.ota_deployment_id or '-'})"),
        ("last seen", _ago(row.last_seen, now)),
    ]
    fact_rows = "".join(
        f"<tr><th>{_e(k)}</th><td id='fact-{i}'><code>{_e(v)}</code></td></tr>" for i, (k, v) in enumerate(facts)
    )
    event_rows = "".join(
        f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(ev.ts))}</td><td>{_e(ev.event)}</td><td><code>{_e(ev.detail)}</code></td></tr>"
        for ev in events
    )
    ota_rows = "".join(
        f"<tr class=ota-entry><td>{time.strftime('%H:%M:%S', time.localtime(o.ts))}</td><td><a href='/ui/deployments/{_e(o.deployment_id)}'>{_e(o.deployment_id)}</a></td>"
        f"<td>{_state(o.state)}{f' <span class=idle>(reported {n}×)</span>' if n > 1 else ''}</td><td>{_e(o.reason)}</td></tr>"
        for o, n in _once_per_state(ota)
    )
    body = (
        f"<h1>Device {_e(device_id)}</h1><section><table id=facts data-live>{fact_rows}</table></section>"
        f"<section><h2>Last {hours:g} h</h2>{latency}{temperature}{precision}{power}{governor}</section>"
        f"{quality_charts(shell.engine, device_id, since)}{capture_list(shell.engine, device_id, operator)}"
        f"<section><h2>OTA history</h2><table id=ota data-live><tr><th>time</th><th>deployment</th><th>state</th><th>reason</th></tr>{ota_rows}</table></section>"
        f"<section><h2>Events</h2><table id=events><tr><th>time</th><th>event</th><th>detail</th></tr>{event_rows}</table></section>"
    )
    return shell.page(device_id, body, operator)


#: The pages of this module (the other page modules mount their own): none in the OpenAPI document.
PAGES = (
    ("GET", "/login", login_page, HTMLResponse),
    ("POST", "/login", login, None),  # None: FastAPI's default (the handler answers a redirect)
    ("GET", "/logout", logout, None),
    ("GET", "/", overview, HTMLResponse),
    ("GET", "/ui/devices/{device_id}", device_page, HTMLResponse),
)


def _presence(label: str) -> str:
    css = {"online": "ok", "offline": "bad"}.get(label, "warn")
    return f'<span class="{css}">{_e(label)}</span>'


def _no_devices_hint(server: str) -> str:
    """What to do on a fleet with no device yet: enroll one (docs/enrollment.md)."""
    return (
        '<section id="no-devices"><h2>No devices yet</h2><p>Start an agent whose <code>[mqtt] broker</code> is this '
        "fleet's broker; it announces its key. Then approve it (compare the key id with the one "
        "<code>edge-agent key --config …</code> shows on the device):</p>"
        f"<pre>edgesdk fleet enroll list --server {_e(server)} --token-file TOKEN_FILE\n"
        f"edgesdk fleet enroll approve DEVICE_ID --server {_e(server)} --token-file TOKEN_FILE --key-id KEY_ID</pre>"
        "<p>See docs/enrollment.md.</p></section>"
    )


def _once_per_state(history: list[Any]) -> list[tuple[Any, int]]:
    """OTA history rows (newest first) with a repeated report of the same state of the same
    deployment folded into its first (a device that rolled back answers a later rollback
    command with ROLLED_BACK again): (row, how many times it was reported)."""
    folded: list[tuple[Any, int]] = []
    for row in history:
        last = folded[-1][0] if folded else None
        if last is not None and (last.deployment_id, last.state) == (row.deployment_id, row.state):
            folded[-1] = (row, folded[-1][1] + 1)  # keep the older row: when it first happened
        else:
            folded.append((row, 1))
    return folded


def _fmt(row: Any, column: str) -> str | None:
    if row is None or getattr(row, column) is None:
        return None
    return f"{getattr(row, column):.2f}" if column == "p95_ms" else f"{getattr(row, column):.0f}"
