"""Webhooks: rollout and alert events POSTed to operator-registered URLs, signed, retried.

Each delivery is a JSON POST with these headers (the scheme of GitHub's and Stripe's)::

    X-Edgesdk-Event: rollout.aborted
    X-Edgesdk-Delivery: <random id>
    X-Edgesdk-Timestamp: <Unix seconds>
    X-Edgesdk-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>

A receiver recomputes the HMAC over the timestamp and the raw body, compares in constant time
(``verify``) and refuses a timestamp older than a few minutes (a replayed delivery). Events:
``rollout.<state>`` (a deployment entered that state: in_progress, succeeded, aborted,
rolled_back...) and ``alert.firing`` / ``alert.resolved`` (``alerts.current_alerts``). A webhook
of format ``alertmanager`` gets alert events as Alertmanager's webhook payload (version 4).

The ``WebhookNotifier`` watches the database (once a second) for these changes, so it needs no
hook in the rollout loop, and delivers from its own thread through a bounded queue: a slow or
dead receiver never blocks a rollout. A failed try (no answer, or not 2xx) is retried with
exponential backoff (1 s, 2 s, 4 s... ``attempts`` tries; a redirect counts as a failure); the outcome of each delivery after its
last try is a ``webhook_deliveries`` row. SSRF: URLs whose host resolves to a link-local address
(169.254.0.0/16 with the clouds' metadata service, fe80::/10), multicast or unspecified are
refused unless ``EDGESDK_WEBHOOK_ALLOW_LINK_LOCAL=1`` is set in the service's environment.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import ipaddress
import json
import logging
import os
import queue
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from edgesdk.errors import UsageError
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction

log = logging.getLogger(__name__)

FORMATS = ("edgesdk", "alertmanager")
ALLOW_LINK_LOCAL_ENV = "EDGESDK_WEBHOOK_ALLOW_LINK_LOCAL"
#: Tries per delivery and the first retry's delay (doubled at each retry), from the environment.
ATTEMPTS_ENV, BACKOFF_ENV = "EDGESDK_WEBHOOK_ATTEMPTS", "EDGESDK_WEBHOOK_BACKOFF_S"
QUEUE_SIZE = 1000


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Edgesdk-Signature`` value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signature: str, *, tolerance_s: float = 300) -> bool:
    """What a receiver does: the signature matches and the timestamp is recent."""
    try:
        fresh = abs(time.time() - float(timestamp)) <= tolerance_s
    except ValueError:
        return False
    return fresh and hmac.compare_digest(sign(secret, timestamp, body), signature)


def check_url(url: str) -> None:
    """A ``UsageError`` naming ``url`` when it is not http(s) or its host is a link-local,
    metadata, multicast or unspecified address (unless the service allows link-local)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"webhook url {url!r} must be http:// or https:// with a host")
    if os.environ.get(ALLOW_LINK_LOCAL_ENV) == "1":
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise UsageError(f"webhook url {url!r}: host {parts.hostname!r} does not resolve ({exc})") from None
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address.is_link_local or address.is_multicast or address.is_unspecified:
            raise UsageError(
                f"webhook url {url!r} resolves to {address}, a link-local/metadata address; "
                f"refused (set {ALLOW_LINK_LOCAL_ENV}=1 on the service to allow)"
            )


def register(engine: Any, *, url: str, secret: str, events: list[str], fmt: str, created_by: str) -> dict[str, Any]:
    check_url(url)
    if fmt not in FORMATS:
        raise UsageError(f"webhook format {fmt!r} unknown: use one of {', '.join(FORMATS)}")
    row = {
        "id": secrets.token_hex(8),
        "url": url,
        "secret": secret,
        "events": json.dumps(events),
        "format": fmt,
        "created": time.time(),
        "created_by": created_by,
    }
    with Transaction(engine) as db:
        db.execute(schema.webhooks.insert().values(**row))
    return shown(row)


def shown(row: Any) -> dict[str, Any]:
    """A webhook as the API shows it: never its secret."""
    data = dict(row._mapping) if hasattr(row, "_mapping") else dict(row)
    data.pop("secret", None)
    data["events"] = json.loads(data["events"])
    return data


def all_webhooks(engine: Any) -> list[Any]:
    with Transaction(engine) as db:
        return list(db.execute(sa.select(schema.webhooks).order_by(schema.webhooks.c.created)).all())


def deliveries(engine: Any, webhook_id: str, limit: int = 100) -> list[dict[str, Any]]:
    d = schema.webhook_deliveries
    with Transaction(engine) as db:
        rows = db.execute(sa.select(d).where(d.c.webhook_id == webhook_id).order_by(d.c.id.desc()).limit(limit)).all()
    return [dict(r._mapping) for r in rows]


def payload(event: str, data: dict[str, Any], fmt: str) -> dict[str, Any]:
    """The JSON body of ``event`` for a webhook of format ``fmt``."""
    if fmt == "alertmanager" and event.startswith("alert."):
        return _alertmanager(event, data)
    return {"event": event, "ts": time.time(), "data": data}


def _alertmanager(event: str, alert: dict[str, Any]) -> dict[str, Any]:
    status = "resolved" if event == "alert.resolved" else "firing"
    labels = {"alertname": f"edgesdk_{alert['kind']}", "severity": alert["severity"], "target": alert["target"]}
    started = alert.get("since") or time.time()
    item = {
        "status": status,
        "labels": labels,
        "annotations": {"summary": alert["message"]},
        "startsAt": _rfc3339(started),
        "endsAt": _rfc3339(time.time()) if status == "resolved" else "0001-01-01T00:00:00Z",
        "fingerprint": hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16],
    }
    return {
        "version": "4",
        "groupKey": f"edgesdk:{labels['alertname']}:{alert['target']}",
        "status": status,
        "receiver": "edgesdk",
        "groupLabels": {"alertname": labels["alertname"]},
        "commonLabels": labels,
        "commonAnnotations": item["annotations"],
        "externalURL": "",
        "alerts": [item],
        "truncatedAlerts": 0,
    }


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is a failed try: following it could lead to an address ``check_url`` refuses."""

    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


_NO_REDIRECTS = urllib.request.build_opener(_RefuseRedirects)


@dataclass(order=True)
class _Delivery:
    due: float
    seq: int
    webhook_id: str = field(compare=False)
    url: str = field(compare=False)
    secret: str = field(compare=False)
    event: str = field(compare=False)
    body: bytes = field(compare=False)
    attempt: int = field(default=1, compare=False)


def retry_settings() -> tuple[int, float]:
    """(attempts, backoff_s) from the service's environment (5 tries, 1 s by default)."""
    try:
        return max(1, int(os.environ.get(ATTEMPTS_ENV, "5"))), max(0.0, float(os.environ.get(BACKOFF_ENV, "1")))
    except ValueError:
        raise UsageError(f"{ATTEMPTS_ENV} must be a whole number and {BACKOFF_ENV} seconds") from None


class WebhookNotifier:
    """Watches rollouts and alerts, and delivers their events to every matching webhook."""

    def __init__(
        self,
        engine: Any,
        store: Any,
        broker_status: Any = None,
        *,
        interval_s: float = 1.0,
        attempts: int = 5,
        backoff_s: float = 1.0,
        timeout_s: float = 5.0,
    ) -> None:
        self.engine, self.store, self.broker_status = engine, store, broker_status
        self.interval_s, self.attempts, self.backoff_s, self.timeout_s = interval_s, attempts, backoff_s, timeout_s
        self._queue: queue.Queue[_Delivery] = queue.Queue(maxsize=QUEUE_SIZE)
        self._stop = threading.Event()
        self._starting = threading.Lock()
        self._started = False
        self._seq = 0
        self._states: dict[str, str] | None = None
        self._alerts: dict[tuple[str, str], dict[str, Any]] | None = None
        self._threads = [
            threading.Thread(target=self._watch, name="webhook-watch", daemon=True),
            threading.Thread(target=self._deliver, name="webhook-deliver", daemon=True),
        ]

    def start(self) -> WebhookNotifier:
        """Start watching and delivering (once; later calls do nothing)."""
        with self._starting:
            if not self._started and not self._stop.is_set():
                self._started = True
                for thread in self._threads:
                    thread.start()
        return self

    def start_if_wanted(self) -> WebhookNotifier:
        """Start when a webhook is registered: a service (or test) without any runs no threads."""
        return self.start() if all_webhooks(self.engine) else self

    def stop(self) -> None:
        self._stop.set()  # a stopped notifier does not start again
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=self.timeout_s + 1)

    def emit(self, event: str, data: dict[str, Any]) -> None:
        """Queue ``event`` for every webhook that wants it; never blocks (a full queue drops it,
        recorded as ``dropped``)."""
        for hook in all_webhooks(self.engine):
            wanted = json.loads(hook.events)
            if wanted and not any(event.startswith(prefix) for prefix in wanted):
                continue
            body = json.dumps(payload(event, data, hook.format), sort_keys=True, default=str).encode()
            self._seq += 1
            delivery = _Delivery(time.time(), self._seq, hook.id, hook.url, hook.secret, event, body)
            try:
                self._queue.put_nowait(delivery)
            except queue.Full:
                self._record(delivery, "dropped", None, "queue full")

    # -- watching ---------------------------------------------------------------------------

    def _watch(self) -> None:
        failing = False
        while not self._stop.wait(self.interval_s):
            try:
                if not all_webhooks(self.engine):
                    self._states = self._alerts = None  # nobody listens: nothing to compare, nothing read
                    continue
                self._check_rollouts()
                self._check_alerts()
                failing = False
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not end the watcher
                if not failing:  # one line per outage, not one a second
                    log.warning("webhook watcher: cannot read the fleet state (%s); trying again", exc)
                failing = True

    def _check_rollouts(self) -> None:
        states = {row.id: row.state for row in self.store.all()}
        if self._states is not None:
            for deployment_id, state in states.items():
                if self._states.get(deployment_id) != state:
                    self.emit(f"rollout.{state.lower()}", {"deployment_id": deployment_id, "state": state})
        self._states = states

    def _check_alerts(self) -> None:
        from edgesdk.fleet.service.alerts import current_alerts

        broker = self.broker_status() if self.broker_status is not None else None
        now = {(a["kind"], a["target"]): a for a in current_alerts(self.engine, self.store, broker)}
        if self._alerts is not None:
            for key, alert in now.items():
                if key not in self._alerts:
                    self.emit("alert.firing", alert)
            for key, alert in self._alerts.items():
                if key not in now:
                    self.emit("alert.resolved", alert)
        self._alerts = now

    # -- delivering -------------------------------------------------------------------------

    def _deliver(self) -> None:
        waiting: list[_Delivery] = []
        while not self._stop.is_set():
            timeout = max(0.0, min(0.5, waiting[0].due - time.time())) if waiting else 0.5
            try:
                heapq.heappush(waiting, self._queue.get(timeout=timeout))
            except queue.Empty:
                pass
            while waiting and waiting[0].due <= time.time() and not self._stop.is_set():
                self._try(heapq.heappop(waiting), waiting)

    def _try(self, delivery: _Delivery, waiting: list[_Delivery]) -> None:
        status, error = self._post(delivery)
        if status is not None and 200 <= status < 300:
            self._record(delivery, "delivered", status, "")
        elif delivery.attempt >= self.attempts:
            self._record(delivery, "failed", status, error)
            log.warning(
                "webhook %s: %s not delivered after %d tries: %s",
                delivery.webhook_id,
                delivery.event,
                delivery.attempt,
                error,
            )
        else:
            delivery.due = time.time() + self.backoff_s * 2 ** (delivery.attempt - 1)
            delivery.attempt += 1
            heapq.heappush(waiting, delivery)

    def _post(self, delivery: _Delivery) -> tuple[int | None, str]:
        timestamp = str(int(time.time()))
        request = urllib.request.Request(  # noqa: S310 - the URL was checked to be http(s)
            delivery.url,
            data=delivery.body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "edgesdk-fleet-webhook",
                "X-Edgesdk-Event": delivery.event,
                "X-Edgesdk-Delivery": f"{delivery.webhook_id}-{delivery.seq}",
                "X-Edgesdk-Timestamp": timestamp,
                "X-Edgesdk-Signature": sign(delivery.secret, timestamp, delivery.body),
            },
        )
        try:
            check_url(delivery.url)  # again at each try: the name may resolve elsewhere now
            with _NO_REDIRECTS.open(request, timeout=self.timeout_s) as answer:
                return answer.status, ""
        except UsageError as exc:
            return None, str(exc)
        except urllib.error.HTTPError as exc:
            return exc.code, f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            return None, str(exc)[:300]

    def _record(self, delivery: _Delivery, outcome: str, status: int | None, error: str) -> None:
        with Transaction(self.engine) as db:
            db.execute(
                schema.webhook_deliveries.insert().values(
                    webhook_id=delivery.webhook_id,
                    event=delivery.event,
                    ts=time.time(),
                    attempts=delivery.attempt,
                    outcome=outcome,
                    status=status,
                    error=error,
                )
            )
