"""Moves messages from the SQLite outbox to the broker, in order, deleting each after its PUBACK.

``QueueForwarder`` keeps a window of messages in flight (``window`` QoS 1 publishes waiting
for PUBACK). It tracks packet id → row id; a PUBACK deletes the row (in small batches, so a
drain is not one fsync-free transaction per message either). If the connection drops, paho
keeps the in-flight messages with their packet ids and resends them (DUP) after the reconnect,
so the window and the id map stay valid; after a process restart everything still in the
outbox is sent again from the oldest row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edgesdk.errors import LinkError
from edgesdk.mqtt.client import MqttClient
from edgesdk.mqtt.queue import MessageQueue

log = logging.getLogger(__name__)

_ACK_BATCH = 64
_ACK_FLUSH_S = 0.05


class QueueForwarder:
    """Drains ``queue`` through ``client``; call ``pump()`` after enqueueing.

    Everything that touches paho runs on the client's network-loop thread: paho calls
    ``on_publish`` while holding its own message lock, so publishing from another thread
    under a lock of ours would invert the lock order and could deadlock.
    """

    def __init__(self, queue: MessageQueue, client: MqttClient, *, window: int = 64) -> None:
        self.queue = queue
        self.client = client
        self.window = max(1, min(window, client.options.max_inflight))
        self._inflight: dict[int, int] = {}  # packet id → row id (loop thread only)
        self._last_sent = 0
        self._ack_lock = threading.Lock()
        self._acked: list[int] = []
        self._last_flush = time.monotonic()
        self.sent = 0
        self.delivered = 0
        self.rejected = 0
        client.on_published = self._on_published
        client.on_connected = self._chain(client.on_connected)
        client.on_tick = self._on_tick

    def _chain(self, previous: Callable[[bool], None] | None) -> Callable[[bool], None]:
        def on_connected(session_present: bool) -> None:
            if previous is not None:
                previous(session_present)
            if self._inflight:
                # paho resends the in-flight messages only after this callback returns; a pump
                # now would put newer rows on the wire ahead of them (seen: seq 5 arriving after
                # 6..55 across a broker restart). Their PUBACKs refill the window in order.
                self.client.request_tick()
                return
            self._pump_now()

        return on_connected

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def pump(self) -> None:
        """Ask the network loop to publish queued messages (up to the window); returns at once."""
        self.client.call_soon(self._pump_now)

    def _pump_now(self) -> int:
        if not self.client.connected:
            return 0
        room = self.window - len(self._inflight)
        if room <= 0 or self._last_sent >= self.queue.last_row_id:
            return 0  # window full, or nothing newer than what was handed over: skip the read
        handed = 0
        for message in self.queue.peek(self._last_sent, room):
            try:
                mid = self.client.publish(message.topic, message.payload, qos=1, retain=message.retain)
            except LinkError as exc:
                log.warning("cannot publish queued message %d: %s", message.row_id, exc)
                break
            self._inflight[mid] = message.row_id
            self._last_sent = message.row_id
            handed += 1
        self.sent += handed
        return handed

    def _on_published(self, mid: int, ok: bool) -> None:
        row_id = self._inflight.pop(mid, None)
        if row_id is None:
            return
        if ok:
            self.delivered += 1
        else:
            # The broker refused it (MQTT 5 PUBACK >= 0x80, e.g. not authorized): resending
            # would be refused again forever, so it leaves the queue, counted and logged.
            self.rejected += 1
            log.error("broker rejected queued message %d (row %d); dropping it", mid, row_id)
        with self._ack_lock:
            self._acked.append(row_id)
            due = len(self._acked) >= _ACK_BATCH or not self._inflight
        if due:
            self.flush()
        else:
            self.client.request_tick()  # the rest of the batch is deleted within _ACK_FLUSH_S
        if len(self._inflight) <= self.window // 2:
            self._pump_now()  # refill in batches: one queue read per half window, not per PUBACK

    def _on_tick(self) -> None:
        """A requested tick (acknowledged rows waiting) or the client's housekeeping (≤ 1 s)."""
        if self._acked:
            if time.monotonic() - self._last_flush >= _ACK_FLUSH_S:
                self.flush()
            else:
                self.client.request_tick()
        if self.client.connected and not self._inflight and self.queue.depth:
            self._pump_now()  # nothing in flight but rows waiting (e.g. a refused publish): try again

    def flush(self) -> None:
        """Delete every acknowledged row now (also called before a clean shutdown)."""
        with self._ack_lock:
            acked, self._acked = self._acked, []
            self._last_flush = time.monotonic()
            if acked:
                self.queue.ack(acked)
