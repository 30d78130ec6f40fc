"""Enrollment through a real mosquitto: a device's retained enroll request is listed, approved,
and a later change of key is flagged instead of silently accepted."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from edgesdk.agent.enrollment import announce_enrollment

from edgesdk.errors import EnrollmentError
from edgesdk.keys import key_id
from edgesdk.mqtt.client import ClientOptions, MqttClient, TlsSettings
from edgesdk.schemas.messages import Presence
from tests.conftest import assert_one_line_error
from tests.mqtt_helpers import wait_acked


def device_announces(broker_url: str, device_id: str, key: X25519PrivateKey) -> None:
    client = MqttClient(ClientOptions(client_id=f"dev-{device_id}-{time.monotonic_ns()}", broker_url=broker_url))
    client.start()
    assert client.wait_connected(60)
    agent = SimpleNamespace(
        config=SimpleNamespace(device_id=device_id, profile="rpi5-8gb", mqtt=SimpleNamespace(namespace="edgesdk")),
        device_public_key=key.public_key().public_bytes_raw,
    )
    assert announce_enrollment(agent, SimpleNamespace(client=client)) is not None
    wait_acked(client)  # the QoS 1 publish acknowledged before disconnecting
    client.stop()


def test_enroll_list_approve_and_key_change(mqtt_broker, edgesdk_cli, tmp_path: Path) -> None:
    registry = str(tmp_path / "reg.json")
    flags = ("--registry", registry, "--broker", mqtt_broker.url, "--wait", "0.5")
    first = X25519PrivateKey.generate()
    device_announces(mqtt_broker.url, "cam-a", first)

    # Someone speaking for cam-a on another device's topic is ignored.
    spoof = MqttClient(ClientOptions(client_id="spoof", broker_url=mqtt_broker.url))
    spoof.start()
    assert spoof.wait_connected(60)
    forged = Presence(
        device_id="cam-a",
        online=True,
        ts="2026-11-30T00:00:00Z",  # type: ignore[arg-type]
        public_key="A" * 43 + "=",
    )
    spoof.publish("edgesdk/devices/cam-z/presence", forged.model_dump_json().encode(), qos=1, retain=True)
    wait_acked(spoof)  # stored (retained) before the listing looks, so the listing is a real check
    spoof.stop()

    listed = edgesdk_cli("fleet", "enroll", "list", *flags, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["device_id"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {"cam-a"}
    assert rows["cam-a"]["status"] == "pending" and rows["cam-a"]["seen_via"] == "enroll"
    assert rows["cam-a"]["offered_key_id"] == key_id(first.public_key())

    wrong = edgesdk_cli("fleet", "enroll", "approve", "cam-a", *flags, "--key-id", "0" * 32)
    assert_one_line_error(wrong, "'cam-a'", "0" * 32)
    approved = edgesdk_cli("fleet", "enroll", "approve", "cam-a", *flags, "--key-id", key_id(first.public_key()))
    assert approved.returncode == 0, approved.stderr

    # The device (or someone) now offers another key: flagged, and not approved without --replace.
    second = X25519PrivateKey.generate()
    device_announces(mqtt_broker.url, "cam-a", second)
    listed = edgesdk_cli("fleet", "enroll", "list", *flags, "--json")
    assert [row["status"] for row in json.loads(listed.stdout)] == ["key changed"]
    # A key read off the broker is approved only against the full id the device shows.
    assert_one_line_error(edgesdk_cli("fleet", "enroll", "approve", "cam-a", *flags), "'cam-a'", "--key-id")
    refused = edgesdk_cli("fleet", "enroll", "approve", "cam-a", *flags, "--key-id", key_id(second.public_key()))
    assert_one_line_error(refused, "'cam-a'", "--replace")

    absent = edgesdk_cli("fleet", "enroll", "approve", "cam-q", *flags)
    assert_one_line_error(absent, "'cam-q'", "cam-a")


def test_unreachable_broker_is_one_line(edgesdk_cli, tmp_path: Path) -> None:
    proc = edgesdk_cli(
        "fleet", "enroll", "list", "--registry", str(tmp_path / "r.json"),
        "--broker", "mqtt://127.0.0.1:9", "--connect-timeout", "1",
    )  # fmt: skip
    assert_one_line_error(proc, "mqtt://127.0.0.1:9")


def test_enrolled_device_gets_its_own_broker_password_and_connects_with_it(edgesdk_cli, tmp_path: Path) -> None:
    """Through the shipped mosquitto config: announce on the bootstrap listener, the operator
    approves with --device-passwords, the device opens the sealed password with its key and
    connects as itself; a revoked device's password stops working."""
    import threading

    from edgesdk.agent.broker_credentials import accept_credentials

    from edgesdk.protocol import topics
    from tests.agent_wiring_helpers import start_link
    from tests.integration.conftest import require_mosquitto
    from tests.mqtt_helpers import FakeAgent
    from tests.pki_helpers import make_test_pki
    from tests.shipped_mosquitto import shipped_broker

    require_mosquitto()
    pki = make_test_pki(tmp_path / "pki")
    device_id, device_key = "cam-e2e", X25519PrivateKey.generate()
    with shipped_broker(tmp_path / "broker", pki, {}) as broker:
        tls = TlsSettings(ca_file=str(pki.ca_file))
        bootstrap = MqttClient(
            ClientOptions(
                client_id="ignored",
                broker_url=broker.url("enrollment"),
                username="edgesdk-enroll",
                password="enroll",
                tls=tls,
                backoff_min_s=0.2,
            )
        )
        delivered = threading.Event()
        received: list[bytes] = []

        def on_message(topic: str, payload: bytes) -> None:
            received.append(payload)
            delivered.set()

        bootstrap.on_message = on_message
        bootstrap.subscribe(topics.device_topic("edgesdk", device_id, topics.ENROLL_CREDENTIALS))
        bootstrap.start()
        assert bootstrap.wait_connected(60), bootstrap.stats.last_error
        agent = SimpleNamespace(
            config=SimpleNamespace(device_id=device_id, profile=None, mqtt=SimpleNamespace(namespace="edgesdk")),
            device_public_key=device_key.public_key().public_bytes_raw,
        )
        assert announce_enrollment(agent, SimpleNamespace(client=bootstrap)) is not None
        wait_acked(bootstrap)  # the retained request stored (after its subscription) before approve looks

        operator_password = tmp_path / "op.password"
        operator_password.write_text("op")
        operator_flags = (
            "--registry", str(tmp_path / "reg.json"), "--device-passwords", str(broker.device_passwords),
        )  # fmt: skip
        broker_flags = (
            "--broker", broker.url("operators"), "--username", "fleet-operator",
            "--password-file", str(operator_password), "--ca-file", str(pki.ca_file), "--wait", "1",
        )  # fmt: skip
        approved = edgesdk_cli(
            "fleet", "enroll", "approve", device_id, *operator_flags, *broker_flags,
            "--key-id", key_id(device_key.public_key()),
        )  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        assert "broker password" in approved.stdout
        assert delivered.wait(60), "the sealed credentials never reached the enrolling device"
        bootstrap.stop()

        # The credentials are sealed: another key cannot open them.
        with pytest.raises(EnrollmentError, match=device_id):
            accept_credentials(received[0], device_id, X25519PrivateKey.generate(), tmp_path / "thief")
        password_file = accept_credentials(received[0], device_id, device_key, tmp_path / "device")
        assert password_file.stat().st_mode & 0o777 == 0o600
        broker.reload()

        presence: list[bytes] = []
        observer = MqttClient(
            ClientOptions(
                client_id="obs", broker_url=broker.url("operators"), username="fleet-operator", password="op", tls=tls
            )
        )
        observer.on_message = lambda _topic, payload: presence.append(payload)
        observer.subscribe(f"edgesdk/devices/{device_id}/presence", qos=1)
        observer.start()
        assert observer.wait_connected(60), observer.stats.last_error
        device = FakeAgent(
            tmp_path / "device",
            broker.url("devices"),
            device_id=device_id,
            username=device_id,
            password_file=password_file,
            tls={"ca_file": pki.ca_file},
        )
        link = start_link(device)
        try:
            assert link.client.wait_connected(60), link.client.stats.last_error
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(json.loads(p)["online"] for p in presence):
                time.sleep(0.05)
            assert any(json.loads(p)["online"] for p in presence), "the device's presence never arrived"
        finally:
            link.stop()

        revoked = edgesdk_cli("fleet", "enroll", "revoke", device_id, *operator_flags)
        assert revoked.returncode == 0, revoked.stderr
        broker.reload()
        again = MqttClient(
            ClientOptions(
                client_id=device_id,
                broker_url=broker.url("devices"),
                username=device_id,
                password=password_file.read_text().strip(),
                tls=tls,
            )
        ).start()
        try:
            assert not again.wait_connected(1.5)
        finally:
            again.stop()
            observer.stop()


def test_reserved_broker_accounts_are_never_issued_to_a_device(edgesdk_cli, tmp_path: Path) -> None:
    key = X25519PrivateKey.generate()
    pub = tmp_path / "k.pub"
    from edgesdk.fleet.enrollment import encode_public_key

    pub.write_text(encode_public_key(key.public_key()))
    proc = edgesdk_cli(
        "fleet", "enroll", "approve", "fleet-operator", "--registry", str(tmp_path / "r.json"),
        "--public-key", pub.read_text(), "--device-passwords", str(tmp_path / "d.passwd"),
        "--credentials-out", str(tmp_path / "c.json"),
    )  # fmt: skip
    assert_one_line_error(proc, "'fleet-operator'", "reserved")
    assert not (tmp_path / "d.passwd").exists() and not (tmp_path / "r.json").exists()
