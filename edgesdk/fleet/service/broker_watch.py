"""The fleet service's view of its own broker connection, and what it means for presence.

Devices' presence reaches the service through the broker only. While the service cannot see
the broker, the database still says whatever it last heard (a Last Will the broker published
as it went down says "offline" for a device that runs on): so the service says "unknown since
HH:MM" instead, raises no offline alert, and after the broker is back it re-learns presence
(the retained presence on its re-subscription, the devices' own reconnects, which back off up
to 30 s) for ``relearn_s`` before a device still marked offline is called offline again.

``BrokerWatch`` is told of every connect and disconnect (``connected``/``lost``, from the MQTT
client's callbacks), logs one WARNING when the broker is lost and one INFO line with the
outage's length when it is back, and answers ``status()`` (``/healthz``, ``/metrics``, the
dashboard's banner) — a snapshot anyone may read from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger(__name__)

#: How long after the broker is back a device still marked offline stays "unknown": the
#: devices' reconnect backoff tops out at 30 s (``ClientOptions.backoff_max_s``), plus a connect.
DEFAULT_RELEARN_S = 35.0


@dataclass(frozen=True)
class BrokerStatus:
    """The service's broker connection: ``connected`` or not, ``since`` when (UTC), and how
    many times it was lost since the service started. ``relearn_until``: presence is being
    re-learned after a reconnect until then (None: not re-learning)."""

    connected: bool
    since: datetime
    disconnects: int
    relearn_until: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``/healthz``)."""
        return {
            "connected": self.connected,
            "since": self.since.isoformat(),
            "disconnects": self.disconnects,
            "relearn_until": None if self.relearn_until is None else self.relearn_until.isoformat(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> BrokerStatus | None:
        """Read :meth:`as_dict`'s JSON back (``fleet devices --server`` reads ``/healthz``); None
        when ``data`` is not one (a service without the field, or one that does not know)."""
        if not isinstance(data, dict) or not isinstance(data.get("connected"), bool):
            return None
        try:
            until = data.get("relearn_until")
            return cls(
                connected=data["connected"],
                since=datetime.fromisoformat(data["since"]),
                disconnects=int(data.get("disconnects", 0)),
                relearn_until=datetime.fromisoformat(until) if until else None,
            )
        except (KeyError, TypeError, ValueError):
            return None

    def presence_known(self, now: datetime | None = None) -> bool:
        """False while a device's stored "offline" may be stale: broker lost, or re-learning."""
        if not self.connected:
            return False
        return self.relearn_until is None or (now or datetime.now(timezone.utc)) >= self.relearn_until


def presence_label(online: bool | None, status: BrokerStatus | None, now: datetime | None = None) -> str:
    """``online``, ``offline``, or ``unknown since HH:MM`` (local time) while the service cannot
    trust a stored offline (a stored online is trusted once the broker is back: a device said so)."""
    if status is not None and not status.connected:
        return f"unknown since {status.since.astimezone().strftime('%H:%M')}"
    if online:
        return "online"
    if status is not None and not status.presence_known(now):
        return f"unknown since {status.since.astimezone().strftime('%H:%M')} (broker back, re-learning)"
    return "offline"


class BrokerWatch:
    """Tracks one MQTT client's connection to ``broker_url`` (see the module's docstring)."""

    def __init__(
        self, broker_url: str, *, relearn_s: float = DEFAULT_RELEARN_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.broker_url = broker_url
        self.relearn_s = relearn_s
        self._clock = clock
        self._lock = threading.Lock()
        self._connected = False
        self._since = clock()
        self._disconnects = 0
        self._relearn_until: float | None = None

    def attach(self, client: Any) -> None:
        """Be told of ``client``'s connects and disconnects (chained after any handler it had)."""
        before_connect, before_lost = client.on_connected, client.on_disconnected

        def on_connected(session_present: bool) -> None:
            if before_connect is not None:
                before_connect(session_present)
            self.connected()

        def on_disconnected(reason: str) -> None:
            if before_lost is not None:
                before_lost(reason)
            self.lost(reason)

        client.on_connected = on_connected
        client.on_disconnected = on_disconnected

    def connected(self) -> None:
        now = self._clock()
        with self._lock:
            if self._connected:
                return
            outage = now - self._since
            reconnect = self._disconnects > 0
            self._connected = True
            self._since = now
            self._relearn_until = now + self.relearn_s if reconnect else None
        if reconnect:
            log.info(
                "broker %s is back after a %.1f s outage; re-learning device presence for %g s",
                self.broker_url,
                outage,
                self.relearn_s,
            )

    def lost(self, reason: str) -> None:
        now = self._clock()
        with self._lock:
            if not self._connected:
                return
            self._connected = False
            self._since = now
            self._disconnects += 1
            self._relearn_until = None
        log.warning(
            "lost the broker %s (%s): device presence is unknown until it is back; no offline alerts meanwhile",
            self.broker_url,
            reason,
        )

    def status(self) -> BrokerStatus:
        with self._lock:
            until = self._relearn_until
            return BrokerStatus(
                connected=self._connected,
                since=datetime.fromtimestamp(self._since, timezone.utc),
                disconnects=self._disconnects,
                relearn_until=None if until is None else datetime.fromtimestamp(until, timezone.utc),
            )
