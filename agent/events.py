"""A small in-process event bus: the governor, the store and the server emit; the MQTT link,
the metrics and the log subscribe. A failing subscriber is logged and never stops the
emitter (a broken telemetry hook must not break a precision switch)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("edgesdk.agent.events")

Subscriber = Callable[[str, dict[str, Any]], None]


class EventBus:
    """``subscribe(fn(name, detail))`` and ``emit(name, detail)``; keeps the last events."""

    def __init__(self, keep: int = 200) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        #: The last events as (unix time, name, detail), newest last: /v1/status shows them.
        self.recent: deque[tuple[float, str, dict[str, Any]]] = deque(maxlen=keep)

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Register ``fn``; returns a function that unsubscribes it."""
        with self._lock:
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    def emit(self, name: str, detail: dict[str, Any] | None = None) -> None:
        """Deliver an event to every subscriber, in the caller's thread."""
        detail = dict(detail or {})
        self.recent.append((time.time(), name, detail))
        with self._lock:
            subscribers = list(self._subscribers)
        for fn in subscribers:
            try:
                fn(name, detail)
            except Exception:  # noqa: BLE001 - a subscriber's bug must not break the emitter
                log.exception("event subscriber %r failed on %s", fn, name)
