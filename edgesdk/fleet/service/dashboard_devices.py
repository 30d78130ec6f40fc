"""The dashboard's devices page (``/ui/devices``): search, filters, sort by column and pages,
all done by the database (WHERE, ORDER BY, LIMIT/OFFSET), so 10,000 devices stay fast
(``benchmarks/bench_dashboard_devices.py``).

* ``q``: a part of the device id, of a group name, or of a server-side tag (``KEY=VALUE``).
* ``state`` (presence: online, offline, unknown — as the service sees its broker now),
  ``group``, ``profile``, ``version`` (model version): exact filters.
* ``sort`` (a column: device, presence, model, profile, ota, seen), ``desc=1``; ``page``,
  ``per_page`` (at most ``MAX_PER_PAGE``).
A bad value is a 400 page naming it and the values allowed.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from edgesdk.errors import UsageError
from edgesdk.fleet.service import captures, schema, tokens
from edgesdk.fleet.service.broker_watch import BrokerStatus, presence_label
from edgesdk.fleet.service.charts import line_chart
from edgesdk.fleet.service.dashboard_ui import PageParts, Pages, Ui, escape, mount_pages, not_found, page_parts
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.metrics import latest_telemetry
from edgesdk.fleet.service.quality import DRIFT_PSI, QualityRow, device_quality

PAGE = "/ui/devices"
PER_PAGE = 50
MAX_PER_PAGE = 200
#: Capture files a device page lists, newest first; GET /api/v1/devices/{id}/captures has up to 1,000.
CAPTURES_SHOWN = 50
STATES = ("online", "offline", "unknown")
_d = schema.devices
SORTS: dict[str, tuple[Any, ...]] = {
    "device": (_d.c.device_id,),
    "presence": (_d.c.online,),
    "model": (_d.c.model_name, _d.c.model_version),
    "profile": (_d.c.profile,),
    "ota": (_d.c.ota_state,),
    "seen": (_d.c.last_seen,),
}
_COLUMNS = (("device", "device"), ("presence", "presence"), ("model", "model"), ("profile", "profile"),
            ("ota", "OTA"), ("", "p95 ms"), ("", "groups"), ("seen", "seen"))  # fmt: skip


class BadQuery(UsageError):
    """A query parameter the page cannot use (the message names it and what is allowed)."""


@dataclass(frozen=True)
class DeviceQuery:
    q: str = ""
    state: str = ""
    group: str = ""
    profile: str = ""
    version: str = ""
    sort: str = "device"
    desc: bool = False
    page: int = 1
    per_page: int = PER_PAGE

    @classmethod
    def parse(cls, params: dict[str, str]) -> DeviceQuery:
        state, sort = params.get("state", ""), params.get("sort", "device") or "device"
        if state and state not in STATES:
            raise BadQuery(f"state {state!r} is not one of {', '.join(STATES)}")
        if sort not in SORTS:
            raise BadQuery(f"sort {sort!r} is not one of {', '.join(SORTS)}")
        page, per_page = _positive(params, "page", 1), _positive(params, "per_page", PER_PAGE)
        if per_page > MAX_PER_PAGE:
            raise BadQuery(f"per_page {per_page} is over {MAX_PER_PAGE}")
        text = {k: params.get(k, "").strip()[:200] for k in ("q", "group", "profile", "version")}
        return cls(**text, state=state, sort=sort, desc=params.get("desc") == "1", page=page, per_page=per_page)

    def link(self, **changes: Any) -> str:
        """This query's page address with ``changes`` (defaults left out)."""
        query = replace(self, **changes)
        params = {k: v for k, v in vars(query).items() if v not in ("", False, None)}
        params = {k: ("1" if v is True else v) for k, v in params.items() if (k, v) not in _DEFAULTS}
        return PAGE + ("?" + urllib.parse.urlencode(params) if params else "")


_DEFAULTS = {("sort", "device"), ("page", 1), ("per_page", PER_PAGE)}


def _positive(params: dict[str, str], name: str, default: int) -> int:
    text = params.get(name, "") or str(default)
    if not text.isdigit() or int(text) < 1:
        raise BadQuery(f"{name} {text!r} is not a whole number from 1")
    return int(text)


def _where(query: DeviceQuery, broker: BrokerStatus | None) -> list[Any]:
    clauses: list[Any] = []
    if query.q:
        pattern = f"%{query.q}%"
        tags = schema.device_tags
        tagged = sa.exists().where(
            (tags.c.device_id == _d.c.device_id) & (tags.c.key + "=" + tags.c.value).ilike(pattern)
        )
        clauses.append(_d.c.device_id.ilike(pattern) | _d.c.groups.ilike(pattern) | tagged)
    if query.group:
        clauses.append(_d.c.groups.like(f"%{json.dumps(query.group)}%"))  # an element of the JSON list
    for column, value in ((_d.c.profile, query.profile), (_d.c.model_version, query.version)):
        if value:
            clauses.append(column == value)
    if query.state:
        clauses.append(_presence_where(query.state, broker))
    return clauses


def _presence_where(state: str, broker: BrokerStatus | None) -> Any:
    """The rows ``presence_label`` would call ``state`` now (unknown: the broker is away)."""
    connected = broker is None or broker.connected
    known = broker is None or broker.presence_known()
    online = _d.c.online.is_(True)
    if state == "online":
        return online if connected else sa.false()
    if state == "offline":
        return sa.not_(online) | _d.c.online.is_(None) if known else sa.false()
    if not connected:
        return sa.true()
    return (sa.not_(online) | _d.c.online.is_(None)) if not known else sa.false()


def find_devices(engine: Any, query: DeviceQuery, broker: BrokerStatus | None = None) -> tuple[int, list[Any], dict]:
    """(how many match, this page's rows, their newest telemetry by device id): three queries."""
    clauses = _where(query, broker)
    columns = SORTS[query.sort]
    order = [c.desc() if query.desc else c.asc() for c in columns] + [_d.c.device_id.asc()]
    offset = (query.page - 1) * query.per_page
    with Transaction(engine) as db:
        total = db.execute(sa.select(sa.func.count()).select_from(_d).where(*clauses)).scalar_one()
        rows = db.execute(sa.select(_d).where(*clauses).order_by(*order).limit(query.per_page).offset(offset)).all()
        ids = [r.device_id for r in rows]
        latest = {r.device_id: r for r in db.execute(latest_telemetry().where(_d.c.device_id.in_(ids)))} if ids else {}
    return total, rows, latest


def add_devices_page(app: FastAPI, context: Any, ui: Ui, broker: Any) -> None:
    """Mount the devices page on ``app``; its handlers find ``ui``, ``context`` and ``broker`` on it."""
    mount_pages(app, _PARTS, PageParts(ui, context, broker), PAGES)


def devices_page(request: Request) -> Response:
    parts = page_parts(request, _PARTS)
    ui = parts.ui
    operator, _session_id = ui.session(request)
    if operator is None:
        return ui.login_redirect()
    try:
        query = DeviceQuery.parse(dict(request.query_params))
    except BadQuery as exc:
        body = f'<h1>Devices</h1><p class="bad" id=query-error>{escape(exc)}</p><p><a href="{PAGE}">all devices</a></p>'
        return ui.page("devices", body, operator, refresh=False, status_code=400)
    status = parts.broker()
    total, rows, latest = find_devices(parts.context.engine, query, status)
    return ui.page("devices", _render(query, total, rows, latest, status), operator)


def download_capture(request: Request, capture_id: int) -> Response:
    """A capture file as the device sealed it, for the operator role, as GET /api/v1/captures/{id}."""
    parts = page_parts(request, _PARTS)
    ui = parts.ui
    operator, _session_id = ui.session(request)
    if operator is None:
        return ui.login_redirect()
    if not tokens.allows(operator.role, "operator"):
        why = f"downloading capture files needs the operator role; you are {operator.role}"
        return ui.page(
            "refused",
            f'<section><p class="bad">{escape(why)}</p></section>',
            operator,
            refresh=False,
            status_code=403,
        )
    found = captures.read_capture(parts.context.engine, capture_id)
    if found is None:
        return ui.page("not found", not_found("capture", str(capture_id)), operator, refresh=False, status_code=404)
    name, data = found
    headers = {"Content-Disposition": f'attachment; filename="{name}"', "Cache-Control": "no-store"}
    return Response(data, media_type="application/octet-stream", headers=headers)


#: Where ``mount_pages`` keeps this module's parts on the app.
_PARTS = "devices_pages"
PAGES: Pages = (
    ("GET", PAGE, devices_page, HTMLResponse),
    ("GET", "/ui/captures/{capture_id}", download_capture, None),
)


def _render(query: DeviceQuery, total: int, rows: list[Any], latest: dict, status: BrokerStatus | None) -> str:
    now = time.time()
    head = "".join(_header(query, key, label) for key, label in _COLUMNS)
    body = "".join(_row(r, latest.get(r.device_id), status, now) for r in rows)
    first = (query.page - 1) * query.per_page + 1 if rows else 0
    pages = max(1, -(-total // query.per_page))
    nav = f"<span id=page-info>{first}–{first + len(rows) - 1 if rows else 0} of {total} · page {query.page} of {pages}</span>"
    if query.page > 1:
        nav = f'<a id=prev-page href="{escape(query.link(page=query.page - 1))}">← previous</a> ' + nav
    if query.page < pages:
        nav += f' <a id=next-page href="{escape(query.link(page=query.page + 1))}">next →</a>'
    return (
        f"<h1>Devices</h1><section>{_filters(query)}</section>"
        f"<section id=device-list data-live><p>{nav}</p><table id=device-table><tr>{head}</tr>{body}</table>"
        + ("" if rows else "<p class=empty id=no-match>No device matches.</p>")
        + "</section>"
    )


def _filters(query: DeviceQuery) -> str:
    def field(name: str, label: str, value: str) -> str:
        return f'<label>{label} <input type=text name={name} id=filter-{name} value="{escape(value)}"></label>'

    states = "".join(f"<option{' selected' if s == query.state else ''}>{s}</option>" for s in ("", *STATES))
    return (
        f'<form method=get action="{PAGE}" id=device-filters>'
        f"{field('q', 'search (id, group, tag)', query.q)}"
        f"<label>presence <select name=state id=filter-state>{states}</select></label>"
        f"{field('group', 'group', query.group)}{field('profile', 'profile', query.profile)}"
        f"{field('version', 'model version', query.version)}"
        f'<input type=hidden name=sort value="{escape(query.sort)}">'
        + ('<input type=hidden name=desc value="1">' if query.desc else "")
        + "<button type=submit id=apply-filters>Apply</button></form>"
    )


def _header(query: DeviceQuery, key: str, label: str) -> str:
    if not key:
        return f"<th>{escape(label)}</th>"
    desc = query.sort == key and not query.desc  # a second click turns the order round
    mark = (" ▼" if query.desc else " ▲") if query.sort == key else ""
    return f'<th><a id="sort-{key}" href="{escape(query.link(sort=key, desc=desc, page=1))}">{escape(label)}</a>{mark}</th>'


def _row(r: Any, telemetry: Any, status: BrokerStatus | None, now: float) -> str:
    label = presence_label(r.online, status)
    css = {"online": "ok", "offline": "bad"}.get(label, "warn")
    p95 = "-" if telemetry is None or telemetry.p95_ms is None else f"{telemetry.p95_ms:.2f}"
    seen = max(0.0, now - r.last_seen)
    ago = f"{seen:.0f} s ago" if seen < 120 else f"{seen / 60:.0f} min ago"
    return (
        f'<tr id="row-{escape(r.device_id)}"><td class=device><a href="/ui/devices/{escape(r.device_id)}">'
        f'{escape(r.device_id)}</a></td><td class=presence><span class="{css}">{escape(label)}</span></td>'
        f"<td>{escape(r.model_name)} {escape(r.model_version)}</td><td>{escape(r.profile)}</td>"
        f"<td>{escape(r.ota_state)}</td><td>{p95}</td><td>{escape(', '.join(json.loads(r.groups)))}</td>"
        f"<td>{ago}</td></tr>"
    )


def quality_charts(engine: Any, device_id: str, since: float) -> str:
    """The device page's model-quality section (issue 41): per model, PSI per tensor over time
    (the drift alert's level dashed), KS per tensor the same way (once an agent sends it: no
    alert reads it), the data-quality counts of each report and, once a
    probation's shadow reported, its agreement per output with the lower bound (the minimum dashed)."""
    rows = device_quality(engine, device_id, since=since)
    models = sorted({r.model for r in rows})
    if not models:
        return "<section id=model-quality><h2>Model quality</h2><p class=empty>no drift or data-quality figures yet</p></section>"
    charts = []
    for model in models:
        mine = [r for r in rows if r.model == model]
        drift, ks = _per_tensor(mine, "psi"), _per_tensor(mine, "ks")
        counts = {name: [(r.ts, float(getattr(r, column))) for r in mine] for name, column in _COUNT_SERIES}
        charts.append(
            f'<div class=quality data-model="{escape(model)}">'
            + line_chart(drift, unit="PSI", title=f"{model}: drift per tensor", threshold=DRIFT_PSI)
            + (line_chart(ks, unit="KS", title=f"{model}: drift per tensor") if ks else "")
            + line_chart(counts, unit="requests", title=f"{model}: data quality per report")
            + _agreement_chart(model, mine)
            + "</div>"
        )
    return "<section id=model-quality><h2>Model quality</h2>" + "".join(charts) + "</section>"


def _per_tensor(rows: list[QualityRow], score: str) -> dict[str, list[tuple[float, float]]]:
    """``score`` over time per tensor, a point for each report that scored it."""
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        for (direction, tensor), value in sorted(r.tensors(score).items()):
            series.setdefault(f"{direction} {tensor}", []).append((r.ts, value))
    return series


def _agreement_chart(model: str, rows: list[QualityRow]) -> str:
    """Shadow agreement and its lower bound per output over the reports that carry it ('' when none
    does); the newest minimum dashed (probation rolls back when the bound stays under it)."""
    series: dict[str, list[tuple[float, float]]] = {}
    minimum = None
    for r in rows:
        for output, figure in sorted((r.agreement or {}).items()):
            series.setdefault(f"{output} {figure['kind']}", []).append((r.ts, figure["value"]))
            series.setdefault(f"{output} lower bound", []).append((r.ts, figure["lower_bound"]))
            minimum = figure.get("minimum", minimum)
    if not series:
        return ""
    title = f"{model}: shadow agreement with the previous release"
    return line_chart(series, unit="agreement", title=title, threshold=minimum)


_COUNT_SERIES = (("NaN/Inf refused", "nonfinite"), ("out of range", "out_of_range"), ("constant", "constant"))


def capture_list(engine: Any, device_id: str, operator: tokens.Operator) -> str:
    """The device page's capture files (issue 41), newest first: when each arrived, its model, size
    and SHA-256. The download link is the operator role's only: a viewer sees that files exist, as
    ``GET /api/v1/devices/{id}/captures`` shows them, not the files (sealed, but the data itself)."""
    found = captures.list_captures(engine, device_id)
    if not found:
        return "<section id=captures><h2>Capture files</h2><p class=empty>none uploaded</p></section>"
    can_download = tokens.allows(operator.role, "operator")
    rows = "".join(_capture_row(c, can_download) for c in found[:CAPTURES_SHOWN])
    more = len(found) - CAPTURES_SHOWN
    rest = f"<p id=captures-more>{more} older: GET /api/v1/devices/{escape(device_id)}/captures</p>" if more > 0 else ""
    return (
        "<section id=captures><h2>Capture files</h2><table id=capture-table><tr><th>received (UTC)</th>"
        f"<th>model</th><th>size</th><th>sha256</th><th>file</th></tr>{rows}</table>{rest}</section>"
    )


def _capture_row(capture: dict[str, Any], can_download: bool) -> str:
    received = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(capture["received"]))
    name = escape(capture["name"])
    file = (
        f'<a class=capture-download href="/ui/captures/{capture["id"]}" download>{name}</a>' if can_download else name
    )
    return (
        f'<tr class=capture id="capture-{capture["id"]}"><td>{received}</td><td>{escape(capture["model"])}</td>'
        f"<td>{capture['size']:,} B</td><td><code>{escape(capture['sha256'])}</code></td><td>{file}</td></tr>"
    )
