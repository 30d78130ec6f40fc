"""Enrollment through a real mosquitto: a device's retained enroll request is listed, approved,
and a later change of key is flagged instead of silently accepted."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from edgesdk.agent.enrollment import announce_enrollment

from edgesdk.keys import key_id
from edgesdk.mqtt.client import ClientOptions, MqttClient
from edgesdk.schemas.messages import Presence
from tests.conftest import assert_one_line_error


def device_announces(broker_url: str, device_id: str, key: X25519PrivateKey) -> None:
    client = MqttClient(ClientOptions(client_id=f"dev-{device_id}-{time.monotonic_ns()}", broker_url=broker_url))
    client.start()
    assert client.wait_connected(10)
    agent = SimpleNamespace(
        config=SimpleNamespace(device_id=device_id, profile="rpi5-8gb", mqtt=SimpleNamespace(namespace="edgesdk")),
        device_public_key=key.public_key().public_bytes_raw,
    )
    assert announce_enrollment(agent, SimpleNamespace(client=client)) is not None
    time.sleep(0.3)  # let the QoS 1 publish be acknowledged before disconnecting
    client.stop()


def test_enroll_list_approve_and_key_change(mqtt_broker, edgesdk_cli, tmp_path: Path) -> None:
    registry = str(tmp_path / "reg.json")
    flags = ("--registry", registry, "--broker", mqtt_broker.url, "--wait", "0.5")
    first = X25519PrivateKey.generate()
    device_announces(mqtt_broker.url, "cam-a", first)

    # Someone speaking for cam-a on another device's topic is ignored.
    spoof = MqttClient(ClientOptions(client_id="spoof", broker_url=mqtt_broker.url))
    spoof.start()
    assert spoof.wait_connected(10)
    forged = Presence(
        device_id="cam-a",
        online=True,
        ts="2026-11-30T00:00:00Z",  # type: ignore[arg-type]
        public_key="A" * 43 + "=",
    )
    spoof.publish("edgesdk/devices/cam-z/presence", forged.model_dump_json().encode(), qos=1, retain=True)
    time.sleep(0.3)
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
    device_announces(mqtt_broker.url, "cam-a", X25519PrivateKey.generate())
    listed = edgesdk_cli("fleet", "enroll", "list", *flags, "--json")
    assert [row["status"] for row in json.loads(listed.stdout)] == ["key changed"]
    refused = edgesdk_cli("fleet", "enroll", "approve", "cam-a", *flags)
    assert_one_line_error(refused, "'cam-a'", "--replace")

    absent = edgesdk_cli("fleet", "enroll", "approve", "cam-q", *flags)
    assert_one_line_error(absent, "'cam-q'", "cam-a")


def test_unreachable_broker_is_one_line(edgesdk_cli, tmp_path: Path) -> None:
    proc = edgesdk_cli(
        "fleet", "enroll", "list", "--registry", str(tmp_path / "r.json"),
        "--broker", "mqtt://127.0.0.1:9", "--connect-timeout", "1",
    )  # fmt: skip
    assert_one_line_error(proc, "mqtt://127.0.0.1:9")
