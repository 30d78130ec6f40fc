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


class TinyMqttServer:
    """A TCP server that speaks just enough MQTT to connect. To a level-5 CONNECT it answers
    like a 3.1.1 broker ("refuse": unacceptable protocol version), like amqtt ("silent": never
    answers nor closes) or like an MQTT 5 broker ("accept")."""

    def __init__(self, *, on_v5: str = "refuse") -> None:
        self.on_v5 = on_v5
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.levels: list[int] = []
        self.accepted = threading.Event()  # an accepting CONNACK is in the client's socket
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
            if level != 4 and self.on_v5 == "silent":
                while self._read_packet(conn) is not None:  # until the client gives up and closes
                    pass
                return
            if level != 4 and self.on_v5 == "refuse":
                conn.sendall(bytes([0x20, 0x02, 0x00, 0x01]))  # "unacceptable protocol version"
                return
            # CONNACK accepted: v5 adds an empty property list.
            conn.sendall(bytes([0x20, 0x02, 0x00, 0x00]) if level == 4 else bytes([0x20, 0x03, 0x00, 0x00, 0x00]))
            self.accepted.set()
            while (packet := self._read_packet(conn)) is not None:
                if packet[0] >> 4 == 12:  # PINGREQ
                    conn.sendall(bytes([0xD0, 0x00]))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def mqtt311_server() -> Iterator[TinyMqttServer]:
    server = TinyMqttServer()
    yield server
    server.close()


def test_client_falls_back_to_mqtt_311_when_the_broker_refuses_5(mqtt311_server: TinyMqttServer) -> None:
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

    server = TinyMqttServer(on_v5="silent")
    options = ClientOptions(client_id="svc", broker_url=f"mqtt://127.0.0.1:{server.port}")
    client = MqttClient(options)
    began = time.monotonic()
    try:
        with caplog.at_level(logging.INFO, logger="edgesdk.mqtt.client"):
            client.start()
            assert client.wait_connected(60), client.stats.last_error
        took = time.monotonic() - began
        assert client.protocol == "3.1.1"
        assert server.levels == [5, 4]
        # Inside the 5 s that `edgesdk fleet serve` waits by default: by design (the constant), and
        # as measured with a bound a test process descheduled for seconds cannot break (~2.0 s quiet).
        assert V5_CONNACK_WAIT_S < 5.0
        assert V5_CONNACK_WAIT_S <= took < 30
        fallbacks = [r for r in caplog.records if "MQTT 3.1.1" in r.getMessage()]
        assert len(fallbacks) == 1 and fallbacks[0].levelno == logging.INFO
    finally:
        client.stop()
        server.close()


def test_a_connack_waiting_unread_at_the_deadline_is_an_answer_not_silence() -> None:
    """A loop busy with many connects may reach a client's deadline before reading the CONNACK
    already in its socket: that client must stay on MQTT 5."""
    import time

    from edgesdk.mqtt.client import NetworkLoop

    server = TinyMqttServer(on_v5="accept")
    loop = NetworkLoop()  # never started: the test turns the loop's handles by hand
    client = MqttClient(ClientOptions(client_id="busy", broker_url=f"mqtt://127.0.0.1:{server.port}"), loop=loop)
    try:
        client.start()
        client._service_connect(time.monotonic())
        client._service_write()  # the CONNECT goes out; the CONNACK comes back unread
        # Sent on loopback: in the client's socket, unread (a fixed 0.2 s could end before a
        # descheduled server thread wrote it, and the client would rightly see silence).
        assert server.accepted.wait(30)
        client._check_connack_wait(time.monotonic() + 60)  # long past the deadline
        assert client.connected and client.protocol == "5"
        assert server.levels == [5]
    finally:
        client._close_socket()
        server.close()


def test_forcing_mqtt_5_waits_for_a_silent_broker_without_falling_back() -> None:
    server = TinyMqttServer(on_v5="silent")
    options = ClientOptions(client_id="svc", broker_url=f"mqtt://127.0.0.1:{server.port}", protocol="5")
    client = MqttClient(options).start()
    try:
        assert not client.wait_connected(3.0)
        assert server.levels == [5]  # the same connection, still waiting: no 3.1.1 try
    finally:
        client.stop()
        server.close()


def test_forcing_mqtt_5_never_falls_back(mqtt311_server: TinyMqttServer) -> None:
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
