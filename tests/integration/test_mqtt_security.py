"""MQTT security with a real mosquitto: the example per-device ACL, mTLS, server verification
and username/password; and attacks on the SHIPPED broker configuration (client-id takeover,
publishing as another device, anonymous and wrong credentials)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgesdk.mqtt.broker import BrokerTls, MosquittoBroker
from tests.agent_wiring_helpers import start_link
from tests.broker_password_helpers import write_password_file
from tests.integration.conftest import require_mosquitto
from tests.mqtt_helpers import FakeAgent
from tests.pki_helpers import LocalPki, make_test_pki
from tests.shipped_mosquitto import ShippedBroker, shipped_broker, shipped_client

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


def _wait(predicate, timeout: float = 60.0) -> bool:  # real broker and clients: long, free when it comes
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
            assert client.wait_connected(60), client.stats.last_error
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
            assert client.wait_connected(60), client.stats.last_error
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
            assert good.wait_connected(60), good.stats.last_error
            assert not bad.wait_connected(1.0) and not anonymous.wait_connected(0.1)
            assert "refused" in (bad.stats.last_error or "") or "closed" in (bad.stats.last_error or "")
        finally:
            for client in (good, bad, anonymous):
                client.stop()


def test_agent_link_over_mutual_tls(mtls_broker: MosquittoBroker, pki: LocalPki, tmp_path: Path) -> None:
    operator = _client(mtls_broker, pki, "fleet-operator")
    seen = _collect(operator, "edgesdk/devices/rpi-001/#")
    operator.start()
    assert operator.wait_connected(60)
    cert = pki.clients["rpi-001"]
    agent = FakeAgent(
        tmp_path / "agent",
        mtls_broker.url,
        device_id="rpi-001",
        tls={"ca_file": pki.ca_file, "cert_file": cert.cert_file, "key_file": cert.key_file},
    )
    link = start_link(agent)
    try:
        assert link.client.wait_connected(60), link.client.stats.last_error
        assert _wait(lambda: any(t.endswith("/presence") for t, _ in seen))
        assert _wait(lambda: any(t.endswith("/telemetry") for t, _ in seen))
    finally:
        link.stop()
        operator.stop()


# -- the shipped configuration (firmware_images/mosquitto/mosquitto.conf) under attack --------

DEVICE_PASSWORDS = {"rpi-001": "pw-of-rpi-001", "rpi-002": "pw-of-rpi-002"}
# Long enough for a takeover's Last Will to reach the observer: the positive control proves it
# (the same wait sees the Will when client ids are not bound).
WILL_WAIT_S = 3.0


def _device_link(broker: ShippedBroker, tmp_path: Path, device_id: str):
    """The real agent link of ``device_id``: client id = device id, presence Last Will."""
    secret = tmp_path / f"{device_id}.password"
    secret.write_text(DEVICE_PASSWORDS[device_id])
    agent = FakeAgent(
        tmp_path / device_id,
        broker.url("devices"),
        device_id=device_id,
        username=device_id,
        password_file=secret,
        tls={"ca_file": broker.pki.ca_file},
    )
    return start_link(agent)


def _offline_wills(seen: list[tuple[str, bytes]], device_id: str) -> list[bytes]:
    import json

    topic = f"edgesdk/devices/{device_id}/presence"
    return [p for t, p in seen if t == topic and json.loads(p).get("online") is False]


@pytest.mark.parametrize(
    ("bind_client_ids", "attacker"),
    [
        (True, "rpi-002"),  # device B with its own valid password
        (True, "edgesdk-enroll"),  # the bootstrap account every image carries
        (False, "rpi-002"),  # positive control: the permissive config before the fix
    ],
    ids=["shipped-device-b", "shipped-bootstrap-account", "control-unbound-client-ids"],
)
def test_client_id_takeover_against_the_shipped_config(
    tmp_path: Path, pki: LocalPki, bind_client_ids: bool, attacker: str
) -> None:
    require_mosquitto()
    with shipped_broker(tmp_path / "broker", pki, DEVICE_PASSWORDS, bind_client_ids=bind_client_ids) as broker:
        observer = shipped_client(broker, "operators", "observer", "fleet-operator", "op")
        seen = _collect(observer, "edgesdk/devices/rpi-001/presence")
        observer.start()
        assert observer.wait_connected(60), observer.stats.last_error
        victim = _device_link(broker, tmp_path, "rpi-001")
        try:
            assert victim.client.wait_connected(60), victim.client.stats.last_error
            assert _wait(lambda: len(seen) >= 1)  # its retained "online" presence: the observer is live
            listener, password = ("enrollment", "enroll") if attacker == "edgesdk-enroll" else ("devices", None)
            intruder = shipped_client(
                broker, listener, "rpi-001", attacker, password or DEVICE_PASSWORDS[attacker]
            )  # the VICTIM's client id, the attacker's own credentials
            intruder.start()
            try:
                assert intruder.wait_connected(60), intruder.stats.last_error
                if bind_client_ids:
                    # The broker renamed the intruder's session to its own username: the victim
                    # keeps its connection and no Will is published for it.
                    assert not _wait(lambda: _offline_wills(seen, "rpi-001") != [], WILL_WAIT_S)
                    assert victim.client.stats.disconnects == 0 and victim.client.connected
                else:
                    assert _wait(lambda: _offline_wills(seen, "rpi-001") != [], WILL_WAIT_S)
                    assert _wait(lambda: victim.client.stats.disconnects >= 1)  # it was kicked off
            finally:
                intruder.stop()
        finally:
            victim.stop()
            observer.stop()


def test_a_device_cannot_write_another_devices_topics_on_the_shipped_config(tmp_path: Path, pki: LocalPki) -> None:
    require_mosquitto()
    with shipped_broker(tmp_path / "broker", pki, DEVICE_PASSWORDS) as broker:
        observer = shipped_client(broker, "operators", "observer", "fleet-operator", "op")
        seen = _collect(observer, "edgesdk/#")
        attacker = shipped_client(broker, "devices", "whatever", "rpi-002", DEVICE_PASSWORDS["rpi-002"])
        bootstrap = shipped_client(broker, "enrollment", "x", "edgesdk-enroll", "enroll")
        clients = [observer, attacker, bootstrap]
        try:
            for client in clients:
                client.start()
                assert client.wait_connected(60), client.stats.last_error
            time.sleep(0.3)
            for topic in ("edgesdk/devices/rpi-001/presence", "edgesdk/devices/rpi-001/ota/chunks/req"):
                attacker.publish(topic, b"forged", qos=1)
                bootstrap.publish(topic, b"forged", qos=1)
            bootstrap.publish("edgesdk/devices/rpi-001/enroll/credentials", b"forged", qos=1)
            attacker.publish("edgesdk/devices/rpi-002/telemetry", b"genuine", qos=1)
            bootstrap.publish("edgesdk/devices/new-cam/enroll", b"genuine-bootstrap", qos=1)
            assert _wait(lambda: ("edgesdk/devices/rpi-002/telemetry", b"genuine") in seen)
            assert _wait(lambda: ("edgesdk/devices/new-cam/enroll", b"genuine-bootstrap") in seen)
            assert [t for t, p in seen if p == b"forged"] == []
        finally:
            for client in clients:
                client.stop()


@pytest.mark.parametrize(
    ("listener", "user", "password"),
    [
        ("devices", None, None),  # anonymous
        ("devices", "rpi-001", "wrong"),  # wrong password
        ("devices", "edgesdk-enroll", "enroll"),  # the bootstrap secret is not a device login
        ("operators", "rpi-001", DEVICE_PASSWORDS["rpi-001"]),  # no free client ids for a device
        ("enrollment", None, None),  # anonymous on the bootstrap listener
        ("enrollment", "rpi-001", DEVICE_PASSWORDS["rpi-001"]),
    ],
)
def test_the_shipped_config_refuses(
    tmp_path: Path, pki: LocalPki, listener: str, user: str | None, password: str | None
) -> None:
    require_mosquitto()
    with shipped_broker(tmp_path / "broker", pki, DEVICE_PASSWORDS) as broker:
        good = shipped_client(broker, listener, "good", *_legit(listener))
        bad = shipped_client(broker, listener, "rpi-009", user, password)
        for client in (good, bad):
            client.start()
        try:
            # The legitimate login on the same listener connects: the refusal is about credentials.
            assert good.wait_connected(60), good.stats.last_error
            assert not bad.wait_connected(1.0)
            assert bad.stats.connects == 0
            assert "refused" in (bad.stats.last_error or "") or "closed" in (bad.stats.last_error or "")
        finally:
            good.stop()
            bad.stop()


def _legit(listener: str) -> tuple[str, str]:
    return {
        "devices": ("rpi-001", DEVICE_PASSWORDS["rpi-001"]),
        "operators": ("fleet-operator", "op"),
        "enrollment": ("edgesdk-enroll", "enroll"),
    }[listener]
