"""The MQTT adapter without a real broker: URLs, backoff, and the MQTT 5 → 3.1.1 fallback."""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterator

import pytest

from edgesdk.errors import UsageError

pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra (pip install 'edgesdk[agent]')")

from edgesdk.mqtt.client import ClientOptions, MqttClient, backoff_delay, parse_broker_url  # noqa: E402


def test_broker_urls_parse_and_bad_ones_name_the_value() -> None:
    assert parse_broker_url("mqtt://10.0.0.5").port == 1883
    secure = parse_broker_url("mqtts://broker.example:9999")
    assert (secure.host, secure.port, secure.tls) == ("broker.example", 9999, True)
    assert parse_broker_url("mqtts://broker.example").port == 8883
    for bad in ("http://x", "broker:1883", "mqtt://", "mqtt://host:notaport"):
        with pytest.raises(UsageError, match="bad broker URL"):
            parse_broker_url(bad)


def test_backoff_grows_is_capped_and_is_jittered() -> None:
    rng = random.Random(7)
    first = [backoff_delay(0, 0.5, 30.0, rng) for _ in range(50)]
    late = [backoff_delay(20, 0.5, 30.0, rng) for _ in range(200)]
    assert all(d == 0.5 for d in first)
    assert all(0.5 <= d <= 30.0 for d in late)
    # Full jitter: a fleet coming back does not reconnect in lock-step.
    assert max(late) - min(late) > 20 and len({round(d, 3) for d in late}) > 150


class Mqtt311OnlyServer:
    """A TCP server that speaks just enough MQTT 3.1.1: refuses protocol level 5 like a 3.1.1
    broker, or (``silent_to_v5``) reads a level-5 CONNECT and never answers nor closes, like amqtt."""

    def __init__(self, *, silent_to_v5: bool = False) -> None:
        self.silent_to_v5 = silent_to_v5
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.levels: list[int] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_packet(conn: socket.socket) -> tuple[int, bytes] | None:
        header = conn.recv(1)
        if not header:
            return None
        length, shift = 0, 0
        while True:
            byte = conn.recv(1)[0]
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        body = b""
        while len(body) < length:
            chunk = conn.recv(length - len(body))
            if not chunk:
                return None
            body += chunk
        return header[0], body

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            packet = self._read_packet(conn)
            if packet is None or packet[0] >> 4 != 1:
                return
            body = packet[1]
            name_len = int.from_bytes(body[:2], "big")
            level = body[2 + name_len]
            self.levels.append(level)
            if level != 4 and self.silent_to_v5:
                while self._read_packet(conn) is not None:  # until the client gives up and closes
                    pass
                return
            if level != 4:
                conn.sendall(bytes([0x20, 0x02, 0x00, 0x01]))  # "unacceptable protocol version"
                return
            conn.sendall(bytes([0x20, 0x02, 0x00, 0x00]))
            while (packet := self._read_packet(conn)) is not None:
                if packet[0] >> 4 == 12:  # PINGREQ
                    conn.sendall(bytes([0xD0, 0x00]))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def mqtt311_server() -> Iterator[Mqtt311OnlyServer]:
    server = Mqtt311OnlyServer()
    yield server
    server.close()


def test_client_falls_back_to_mqtt_311_when_the_broker_refuses_5(mqtt311_server: Mqtt311OnlyServer) -> None:
    options = ClientOptions(client_id="dev-1", broker_url=f"mqtt://127.0.0.1:{mqtt311_server.port}", backoff_min_s=0.05)
    client = MqttClient(options).start()
    try:
        assert client.wait_connected(10), client.stats.last_error
        assert client.protocol == "3.1.1"
        assert mqtt311_server.levels[0] == 5 and mqtt311_server.levels[-1] == 4
    finally:
        client.stop()


def test_client_falls_back_to_mqtt_311_when_a_v5_connect_goes_unanswered(caplog: pytest.LogCaptureFixture) -> None:
    """amqtt (the demo's embedded broker) neither answers a v5 CONNECT nor closes the socket:
    without a bound on the wait the client never connects (edgesdk issue 36)."""
    import logging
    import time

    from edgesdk.mqtt.client import V5_CONNACK_WAIT_S

    server = Mqtt311OnlyServer(silent_to_v5=True)
    options = ClientOptions(client_id="svc", broker_url=f"mqtt://127.0.0.1:{server.port}")
    client = MqttClient(options)
    began = time.monotonic()
    try:
        with caplog.at_level(logging.INFO, logger="edgesdk.mqtt.client"):
            client.start()
            # Inside the 5 s that `edgesdk fleet serve` waits by default.
            assert client.wait_connected(5.0), client.stats.last_error
        took = time.monotonic() - began
        assert client.protocol == "3.1.1"
        assert server.levels == [5, 4]
        assert V5_CONNACK_WAIT_S <= took < 5.0
        fallbacks = [r for r in caplog.records if "MQTT 3.1.1" in r.getMessage()]
        assert len(fallbacks) == 1 and fallbacks[0].levelno == logging.INFO
    finally:
        client.stop()
        server.close()


def test_forcing_mqtt_5_waits_for_a_silent_broker_without_falling_back() -> None:
    server = Mqtt311OnlyServer(silent_to_v5=True)
    options = ClientOptions(client_id="svc", broker_url=f"mqtt://127.0.0.1:{server.port}", protocol="5")
    client = MqttClient(options).start()
    try:
        assert not client.wait_connected(3.0)
        assert server.levels == [5]  # the same connection, still waiting: no 3.1.1 try
    finally:
        client.stop()
        server.close()


def test_forcing_mqtt_5_never_falls_back(mqtt311_server: Mqtt311OnlyServer) -> None:
    options = ClientOptions(
        client_id="dev-1", broker_url=f"mqtt://127.0.0.1:{mqtt311_server.port}", protocol="5", backoff_min_s=0.05
    )
    client = MqttClient(options).start()
    try:
        assert not client.wait_connected(1.0)
        assert set(mqtt311_server.levels) == {5} and len(mqtt311_server.levels) >= 2  # it keeps retrying
        assert "Unsupported protocol version" in (client.stats.last_error or "")
    finally:
        client.stop()


def test_unreachable_broker_is_retried_with_backoff_not_raised() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = MqttClient(ClientOptions(client_id="d", broker_url=f"mqtt://127.0.0.1:{port}", backoff_min_s=0.05))
    client.start()
    try:
        assert not client.wait_connected(0.8)
        assert client.stats.connect_failures >= 2
        assert "refused" in (client.stats.last_error or "").lower()
    finally:
        client.stop()
