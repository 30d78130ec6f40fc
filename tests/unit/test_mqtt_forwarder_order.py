"""The outbox forwarder keeps row order across a reconnect (a fake client stands in for paho).

paho resends the messages that were in flight when the connection dropped only *after* the
on_connect callback returns; anything published inside that callback goes on the wire first.
So the forwarder must not hand newer rows over while older ones still wait for their resend.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from edgesdk.mqtt.forwarder import QueueForwarder
from edgesdk.mqtt.queue import MessageQueue


class FakeClient:
    """What the forwarder uses of MqttClient: a wire log, a connected flag, ticks."""

    def __init__(self) -> None:
        self.options = SimpleNamespace(max_inflight=4)
        self.connected = True
        self.on_published = None
        self.on_connected = None
        self.on_tick = None
        self.wire: list[bytes] = []
        self.ticks_requested = 0
        self._next_mid = 0
        self._pending: dict[int, bytes] = {}

    def call_soon(self, fn) -> None:
        fn()

    def request_tick(self) -> None:
        self.ticks_requested += 1

    def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> int:
        self._next_mid += 1
        self._pending[self._next_mid] = payload
        self.wire.append(payload)
        return self._next_mid

    def reconnect(self) -> None:
        """What paho does on CONNACK: the callback first, then the in-flight resends."""
        waiting = list(self._pending.values())  # published before the drop, never acknowledged
        self.connected = True
        self.on_connected(False)
        self.wire.extend(waiting)

    def puback_all(self) -> None:
        for mid in list(self._pending):
            del self._pending[mid]
            self.on_published(mid, True)


def test_rows_in_flight_at_a_disconnect_go_out_again_before_any_newer_row(tmp_path: Path) -> None:
    client = FakeClient()
    queue = MessageQueue(tmp_path / "outbox.db")
    forwarder = QueueForwarder(queue, client, window=4)
    queue.enqueue("t", b"1")
    forwarder.pump()
    assert client.wire == [b"1"]  # in flight, no PUBACK yet

    client.connected = False  # the broker goes away with row 1 unacknowledged
    for payload in (b"2", b"3"):
        queue.enqueue("t", payload)
        forwarder.pump()
    assert client.wire == [b"1"]

    client.wire.clear()
    client.reconnect()
    assert client.wire == [b"1"], "row 1's resend must come before rows 2 and 3"
    assert client.ticks_requested  # the forwarder asked to look again soon
    client.puback_all()  # row 1 acknowledged: the window refills in row order
    assert client.wire == [b"1", b"2", b"3"]
    client.puback_all()
    forwarder.flush()
    assert queue.depth == 0
    queue.close()


def test_a_reconnect_with_nothing_in_flight_pumps_the_backlog_at_once(tmp_path: Path) -> None:
    client = FakeClient()
    queue = MessageQueue(tmp_path / "outbox.db")
    forwarder = QueueForwarder(queue, client, window=4)
    client.connected = False
    queue.enqueue("t", b"1")
    queue.enqueue("t", b"2")
    forwarder.pump()
    assert client.wire == []
    client.reconnect()
    assert client.wire == [b"1", b"2"]
    queue.close()
