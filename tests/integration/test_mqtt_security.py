"""MQTT security with a real mosquitto: the example per-device ACL, mTLS, server verification
and username/password."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from edgesdk.agent.link import start_link

from edgesdk.mqtt.broker import BrokerTls, MosquittoBroker, write_password_file
from edgesdk.mqtt.certs import LocalPki, make_test_pki
from tests.integration.conftest import require_mosquitto
from tests.mqtt_helpers import FakeAgent

pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra")

from edgesdk.mqtt.client import ClientOptions, MqttClient, TlsSettings  # noqa: E402

EXAMPLE_ACL = Path(__file__).resolve().parents[2] / "firmware_images" / "mosquitto" / "edgesdk.acl"


@pytest.fixture
def pki(tmp_path: Path) -> LocalPki:
    return make_test_pki(tmp_path / "pki", ["rpi-001", "rpi-002", "fleet-operator"])


@pytest.fixture
def mtls_broker(tmp_path: Path, pki: LocalPki) -> Iterator[MosquittoBroker]:
    require_mosquitto()
    tls = BrokerTls(
        pki.ca_file, pki.server_cert, pki.server_key, require_certificate=True, use_identity_as_username=True
    )
    with MosquittoBroker(tls=tls, acl_file=EXAMPLE_ACL, data_dir=tmp_path / "broker") as broker:
        yield broker


def _client(broker: MosquittoBroker, pki: LocalPki, name: str | None, *, ca: Path | None = None, **kw) -> MqttClient:
    cert = pki.clients[name] if name else None
    tls = TlsSettings(
        ca_file=str(ca or pki.ca_file),
        cert_file=str(cert.cert_file) if cert else None,
        key_file=str(cert.key_file) if cert else None,
    )
    options = ClientOptions(client_id=name or "anonymous", broker_url=broker.url, tls=tls, backoff_min_s=0.1, **kw)
    return MqttClient(options)


def _collect(client: MqttClient, topic_filter: str) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []
    client.on_message = lambda topic, payload: got.append((topic, payload))
    client.subscribe(topic_filter, qos=1)
    return got


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    return predicate()


def test_a_device_cannot_publish_as_another_device(mtls_broker: MosquittoBroker, pki: LocalPki) -> None:
    operator = _client(mtls_broker, pki, "fleet-operator")
    seen = _collect(operator, "edgesdk/#")
    victim = _client(mtls_broker, pki, "rpi-002")
    victim_inbox = _collect(victim, "edgesdk/devices/rpi-002/#")
    attacker = _client(mtls_broker, pki, "rpi-001")
    clients = [operator, victim, attacker]
    try:
        for client in clients:
            client.start()
            assert client.wait_connected(10), client.stats.last_error
        time.sleep(0.3)
        for topic in (
            "edgesdk/devices/rpi-002/telemetry",
            "edgesdk/devices/rpi-002/presence",
            "edgesdk/devices/rpi-002/ota/deployment",
            "edgesdk/groups/line-2/ota/deployment",
        ):
            attacker.publish(topic, b"forged", qos=1)
        attacker.publish("edgesdk/devices/rpi-001/telemetry", b"genuine", qos=1)
        # The broker handles one connection's publishes in order: once the genuine one has
        # arrived, every forged one before it was routed (or refused) already.
        assert _wait(lambda: ("edgesdk/devices/rpi-001/telemetry", b"genuine") in seen)
        assert attacker.protocol != "5" or _wait(lambda: attacker.stats.rejected == 4)
        assert [t for t, p in seen if p == b"forged"] == []
        assert victim_inbox == []
        # With MQTT 5 the broker tells the attacker: PUBACK "Not authorized".
        assert attacker.protocol != "5" or attacker.stats.rejected == 4
    finally:
        for client in clients:
            client.stop()


def test_a_device_reads_its_own_and_its_groups_topics_only(mtls_broker: MosquittoBroker, pki: LocalPki) -> None:
    operator = _client(mtls_broker, pki, "fleet-operator")
    device = _client(mtls_broker, pki, "rpi-001")
    inbox = _collect(device, "edgesdk/devices/rpi-001/#")  # one list collects everything it receives
    for other in ("edgesdk/groups/line-1/#", "edgesdk/devices/rpi-002/#", "edgesdk/groups/line-2/#"):
        device.subscribe(other, qos=1)
    try:
        for client in (operator, device):
            client.start()
            assert client.wait_connected(10), client.stats.last_error
        time.sleep(0.3)
        for topic in (
            "edgesdk/devices/rpi-001/ota/deployment",
            "edgesdk/groups/line-1/ota/deployment",
            "edgesdk/devices/rpi-002/ota/deployment",
            "edgesdk/groups/line-2/ota/deployment",
        ):
            operator.publish(topic, topic.encode(), qos=1)
        # A last message the device may read: once it has arrived, the earlier ones were routed.
        operator.publish("edgesdk/devices/rpi-001/ota/deployment", b"sentinel", qos=1)
        assert _wait(lambda: b"sentinel" in [p for _, p in inbox])
        assert sorted(t for t, p in inbox if p != b"sentinel") == [
            "edgesdk/devices/rpi-001/ota/deployment",
            "edgesdk/groups/line-1/ota/deployment",
        ]
    finally:
        operator.stop()
        device.stop()


def test_mtls_refuses_clients_without_a_certificate_or_with_the_wrong_ca(
    mtls_broker: MosquittoBroker, pki: LocalPki, tmp_path: Path
) -> None:
    no_cert = _client(mtls_broker, pki, None)
    stranger_pki = make_test_pki(tmp_path / "stranger", [])
    wrong_ca = _client(mtls_broker, pki, "rpi-001", ca=stranger_pki.ca_file)
    for client in (no_cert, wrong_ca):
        client.start()
    try:
        assert not no_cert.wait_connected(1.5) and not wrong_ca.wait_connected(0.1)
        # The client verifies the broker: a CA that did not sign the server cert is refused.
        assert "CERTIFICATE_VERIFY_FAILED" in (wrong_ca.stats.last_error or "")
        assert no_cert.stats.connects == 0
    finally:
        no_cert.stop()
        wrong_ca.stop()


def test_username_and_password(tmp_path: Path, pki: LocalPki) -> None:
    require_mosquitto()
    passwords = write_password_file(tmp_path / "passwd", {"rpi-001": "s3cret", "fleet-operator": "op"})
    tls = BrokerTls(pki.ca_file, pki.server_cert, pki.server_key)
    with MosquittoBroker(tls=tls, password_file=passwords, acl_file=EXAMPLE_ACL, data_dir=tmp_path / "b") as broker:
        good = _client(broker, pki, None, username="rpi-001", password="s3cret")
        bad = _client(broker, pki, None, username="rpi-001", password="wrong")
        anonymous = _client(broker, pki, None)
        for client in (good, bad, anonymous):
            client.start()
        try:
            assert good.wait_connected(10), good.stats.last_error
            assert not bad.wait_connected(1.0) and not anonymous.wait_connected(0.1)
            assert "refused" in (bad.stats.last_error or "") or "closed" in (bad.stats.last_error or "")
        finally:
            for client in (good, bad, anonymous):
                client.stop()


def test_the_example_mosquitto_conf_is_accepted_by_mosquitto(tmp_path: Path, pki: LocalPki) -> None:
    require_mosquitto()
    import os
    import socket
    import subprocess

    from edgesdk.mqtt.broker import find_mosquitto

    example = EXAMPLE_ACL.with_name("mosquitto.conf").read_text()
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    passwords = write_password_file(tmp_path / "passwd", {"fleet-operator": "op"})
    config = (
        example.replace("listener 8883", f"listener {ports[0]} 127.0.0.1")
        .replace("listener 8884", f"listener {ports[1]} 127.0.0.1")
        .replace("/etc/mosquitto/certs/ca.crt", str(pki.ca_file))
        .replace("/etc/mosquitto/certs/server.crt", str(pki.server_cert))
        .replace("/etc/mosquitto/certs/server.key", str(pki.server_key))
        .replace("/etc/mosquitto/edgesdk.acl", str(EXAMPLE_ACL))
        .replace("/etc/mosquitto/edgesdk.passwd", str(passwords))
        .replace("/var/lib/mosquitto/", f"{tmp_path}/")
    )
    if os.geteuid() == 0:
        config += "user root\n"
    (tmp_path / "example.conf").write_text(config)
    binary = find_mosquitto()
    assert binary is not None
    proc = subprocess.Popen([binary, "-c", str(tmp_path / "example.conf")], stderr=subprocess.PIPE, text=True)
    try:
        assert _wait(lambda: _accepts(ports[0]) and _accepts(ports[1]), 10), proc.stderr
        device = MqttClient(
            ClientOptions(
                client_id="rpi-001",
                broker_url=f"mqtts://127.0.0.1:{ports[0]}",
                tls=TlsSettings(
                    str(pki.ca_file), str(pki.clients["rpi-001"].cert_file), str(pki.clients["rpi-001"].key_file)
                ),
            )
        ).start()
        operator = MqttClient(
            ClientOptions(
                client_id="op",
                broker_url=f"mqtts://127.0.0.1:{ports[1]}",
                username="fleet-operator",
                password="op",
                tls=TlsSettings(str(pki.ca_file)),
            )
        ).start()
        try:
            assert device.wait_connected(10), device.stats.last_error
            assert operator.wait_connected(10), operator.stats.last_error
        finally:
            device.stop()
            operator.stop()
    finally:
        proc.terminate()
        proc.wait(10)


def _accepts(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


def test_agent_link_over_mutual_tls(mtls_broker: MosquittoBroker, pki: LocalPki, tmp_path: Path) -> None:
    operator = _client(mtls_broker, pki, "fleet-operator")
    seen = _collect(operator, "edgesdk/devices/rpi-001/#")
    operator.start()
    assert operator.wait_connected(10)
    cert = pki.clients["rpi-001"]
    agent = FakeAgent(
        tmp_path / "agent",
        mtls_broker.url,
        device_id="rpi-001",
        tls={"ca_file": pki.ca_file, "cert_file": cert.cert_file, "key_file": cert.key_file},
    )
    link = start_link(agent)
    try:
        assert link.client.wait_connected(10), link.client.stats.last_error
        assert _wait(lambda: any(t.endswith("/presence") for t, _ in seen))
        assert _wait(lambda: any(t.endswith("/telemetry") for t, _ in seen))
    finally:
        link.stop()
        operator.stop()
