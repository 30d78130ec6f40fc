"""The dashboard live, by server-sent events instead of reloading every page every 5 s.

``GET /ui/events`` (the session cookie, like the pages) is an ``text/event-stream`` that
sends ``live`` once it watches (the page then fetches itself once: what changed before is
shown too), then a small event when something an operator watches changed: ``device`` (presence, OTA
state, model version of one device), ``rollout`` (state, wave and per-state counts of one
recent rollout), ``alerts`` (how many), ``enrollment`` (a pending request and its keys), ``broker`` (the
service's view of its broker). A comment line every ``HEARTBEAT_S`` keeps proxies from closing
an idle stream. The page's script (``LIVE_JS``, allowed by hash in the CSP like the others)
fetches the page again on an event and swaps only the elements marked ``data-live`` whose
content changed, so a form being typed in is never lost.

Bounded: at most ``MAX_STREAMS_PER_SESSION`` open streams per session (429 beyond: a page
left open in many tabs cannot hold the service's threads); a stream ends when its session ends
(sign-out, expiry, the token revoked) and after ``MAX_STREAM_S`` (the browser reconnects).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES
from edgesdk.fleet.service import schema, tokens
from edgesdk.fleet.service.broker_watch import BrokerStatus, presence_label
from edgesdk.fleet.service.database import Transaction

MAX_STREAMS_PER_SESSION = 4
POLL_S = 1.0
HEARTBEAT_S = 15.0
MAX_STREAM_S = 600.0
#: Rollouts watched: the running ones and the latest finished ones (the overview shows 20).
RECENT_ROLLOUTS = 20

# On any change event, fetch this page again and swap the [data-live] parts that differ; never
# the whole page (a half-typed form stays). A constant text: the CSP allows it by hash.
LIVE_JS = """
(function(){if(!window.EventSource||!window.DOMParser)return;
var es=new EventSource('/ui/events'),busy=false,again=false;
function swap(html){var doc=new DOMParser().parseFromString(html,'text/html');
document.querySelectorAll('[data-live]').forEach(function(el){var n=doc.getElementById(el.id);
if(n&&n.innerHTML!==el.innerHTML)el.innerHTML=n.innerHTML;});}
function refresh(){if(busy){again=true;return;}busy=true;
fetch(location.href,{credentials:'same-origin',cache:'no-store'})
.then(function(r){return r.ok&&!r.redirected?r.text():'';}).then(function(t){if(t)swap(t);})
.catch(function(){}).then(function(){busy=false;if(again){again=false;refresh();}});}
['live','device','rollout','alerts','enrollment','broker'].forEach(function(k){es.addEventListener(k,refresh);});
es.addEventListener('end',function(){es.close();});})();
"""


class StreamLimit:
    """Counts the open streams of each session (the service's threads are few)."""

    def __init__(self, limit: int = MAX_STREAMS_PER_SESSION) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, session_id: str) -> bool:
        with self._lock:
            if self._open.get(session_id, 0) >= self.limit:
                return False
            self._open[session_id] = self._open.get(session_id, 0) + 1
            return True

    def release(self, session_id: str) -> None:
        with self._lock:
            left = self._open.get(session_id, 1) - 1
            if left > 0:
                self._open[session_id] = left
            else:
                self._open.pop(session_id, None)


def snapshot(engine: Any, broker: BrokerStatus | None) -> dict[str, dict[str, Any]]:
    """What the pages show that may change, keyed by event kind then by item."""
    d, dep, dd, er = schema.devices, schema.deployments, schema.deployment_devices, schema.enrollment_requests
    with Transaction(engine) as db:
        devices = db.execute(sa.select(d.c.device_id, d.c.online, d.c.ota_state, d.c.model_version)).all()
        recent = db.execute(
            sa.select(dep.c.id, dep.c.state, dep.c.wave).order_by(dep.c.created.desc()).limit(RECENT_ROLLOUTS)
        ).all()
        counts = db.execute(
            sa.select(dd.c.deployment_id, dd.c.state, sa.func.count())
            .where(dd.c.deployment_id.in_([r.id for r in recent]))
            .group_by(dd.c.deployment_id, dd.c.state)
        ).all()
        pending = db.execute(
            sa.select(er.c.device_id, er.c.key_id, er.c.offered_key_id).where(er.c.status == "pending")
        ).all()
    by_state: dict[str, dict[str, int]] = {}
    for deployment_id, state, n in counts:
        by_state.setdefault(deployment_id, {})[state] = n
    presence = {r.device_id: presence_label(r.online, broker) for r in devices}
    offline = sum(1 for p in presence.values() if p == "offline")
    aborted = sum(1 for r in recent if r.state == "ABORTED")
    return {
        "device": {
            r.device_id: {"device_id": r.device_id, "presence": presence[r.device_id], "ota_state": r.ota_state}
            | {"model_version": r.model_version}
            for r in devices
        },
        "rollout": {
            r.id: {"deployment_id": r.id, "state": r.state, "wave": r.wave, "by_state": by_state.get(r.id, {})}
            | {"finished": r.state in FINISHED_ROLLOUT_STATES}
            for r in recent
        },
        "alerts": {"alerts": {"count": offline + aborted}},
        "enrollment": {
            r.device_id: {"device_id": r.device_id, "key_id": r.key_id, "offered_key_id": r.offered_key_id}
            for r in pending
        },
        "broker": {"broker": {"known": broker is None or broker.presence_known()}},
    }


class SharedSnapshot:
    """One ``snapshot`` a poll for every open stream (10,000 devices: ~90 ms on a 2-core VM),
    so the database's work does not grow with the number of dashboards open."""

    def __init__(self, engine: Any, max_age_s: float = POLL_S * 0.9) -> None:
        self.engine = engine
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._taken = -1e9
        self._value: dict[str, dict[str, Any]] = {}

    def get(self, broker: BrokerStatus | None) -> dict[str, dict[str, Any]]:
        with self._lock:  # the streams waiting here get the one just taken
            if time.monotonic() - self._taken >= self.max_age_s:
                self._value = snapshot(self.engine, broker)
                self._taken = time.monotonic()
            return self._value


def changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> list[str]:
    """The SSE messages saying what differs between two snapshots (gone items say so)."""
    messages = []
    for kind, items in after.items():
        old = before.get(kind, {})
        for key, value in items.items():
            if old.get(key) != value:
                messages.append(_message(kind, value))
        for key in old.keys() - items.keys():
            messages.append(_message(kind, {"id": key, "gone": True}))
    return messages


def _message(kind: str, data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, sort_keys=True)}\n\n"


def add_live_events(
    app: FastAPI, context: Any, session_id_of: Callable[[Request], str], broker: Callable[[], Any]
) -> None:
    """Mount ``GET /ui/events`` on ``app``."""
    engine = context.engine
    limit = StreamLimit()
    shared = SharedSnapshot(engine)

    @app.get("/ui/events", include_in_schema=False)
    async def live_events(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        session_id = session_id_of(request)
        operator = await run_in_threadpool(tokens.session_operator, engine, session_id) if session_id else None
        if operator is None:
            return PlainTextResponse("sign in first", status_code=401)
        if not limit.acquire(session_id):
            return PlainTextResponse(
                f"too many live streams for this session (at most {limit.limit}); close some dashboard tabs",
                status_code=429,
            )

        async def stream() -> AsyncIterator[str]:
            try:
                last = await run_in_threadpool(shared.get, broker())
                # 'live' once the stream's baseline is taken: the page fetches itself again, so a
                # change between the page's render and this baseline (or during a reconnect) is
                # shown too; it made no event, the baseline already held it (a device reaching
                # PROBATION in that gap stayed unseen until its next change).
                yield f'retry: 3000\nevent: live\ndata: {{"since": {time.time():.0f}}}\n\n'
                started = beat = time.monotonic()
                while time.monotonic() - started < MAX_STREAM_S:
                    await asyncio.sleep(POLL_S)
                    if await request.is_disconnected():
                        return
                    if await run_in_threadpool(tokens.session_operator, engine, session_id) is None:
                        yield _message("end", {"why": "the session ended; sign in again"})
                        return
                    now = await run_in_threadpool(shared.get, broker())
                    for message in changes(last, now):
                        yield message
                        beat = time.monotonic()
                    last = now
                    if time.monotonic() - beat >= HEARTBEAT_S:
                        yield ": heartbeat\n\n"
                        beat = time.monotonic()
            finally:
                limit.release(session_id)

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)
