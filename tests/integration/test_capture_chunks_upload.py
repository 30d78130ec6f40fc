"""Capture files larger than one message (issue 41) through real processes: a real ``edge-agent
run`` with ``[capture] upload = true``, a real mosquitto and the service process on SQLite (the
fixtures of test_capture_upload.py). A 3 MB capture file goes in chunks, arrives byte-identical,
opens with the operator key, and the device's copy is deleted once the service acknowledges it;
acks that do not name a file the device sent (a wrong SHA-256, another device's id, another
device's topic) delete nothing. On the SHIPPED broker configuration a device can neither write
another device's ack topic nor read it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")
pytest.importorskip("onnxruntime")
pytest.importorskip("httpx")

import numpy as np  # noqa: E402

from edgesdk.capture.record import unpack_record  # noqa: E402
from edgesdk.capture.sealed import open_sealed  # noqa: E402
from edgesdk.capture.upload import CHUNK_BYTES, CaptureAck  # noqa: E402
from edgesdk.keys import load_device_private_key  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient  # noqa: E402
from tests.agent_helpers import AgentProcess  # noqa: E402
from tests.capture_helpers import (  # noqa: E402
    ACK_TOPIC,
    DEVICE_PASSWORDS,
    LEDGER,
    digits_device,
    fully_queued,
    get,
    listed_captures,
    put_capture,
    start_service,
    until,
    upload_config,
)
from tests.integration.conftest import require_mosquitto  # noqa: E402
from tests.pki_helpers import make_test_pki  # noqa: E402
from tests.shipped_mosquitto import shipped_broker, shipped_client  # noqa: E402

pytestmark = [pytest.mark.integration]


def test_a_3mb_capture_arrives_in_chunks_and_leaves_the_device_only_on_its_ack(
    digits, tmp_path: Path, request: Any
) -> None:
    require_mosquitto()
    device, operator_private, operator_public = digits_device(digits, tmp_path, request)
    capture_dir = device.data_dir / "capture"
    unstored, _ = put_capture(capture_dir, 1, operator_public)  # sent before any service listens
    with MosquittoBroker(data_dir=tmp_path / "mosquitto") as broker:
        upload_config(device, broker, operator_public)
        forger = MqttClient(ClientOptions(client_id="forger", broker_url=broker.url))
        presence: list[bytes] = []
        forger.on_message = lambda topic, payload: presence.append(payload)
        forger.subscribe("edgesdk/devices/dev-1/presence", qos=1)  # retained: seen whenever it comes
        forger.start()
        try:
            assert forger.wait_connected(60), forger.stats.last_error
            with AgentProcess(device) as agent:
                ledger = capture_dir / LEDGER
                assert until(lambda: fully_queued(ledger, unstored.name), 60), agent.log()[-3000:]
                # Queued is not connected: an ack published before the agent subscribed would be
                # lost. It subscribes before it says it is online, so wait for that.
                assert until(lambda: any(json.loads(p)["online"] for p in presence), 60), agent.log()[-3000:]
                sha256 = hashlib.sha256(unstored.read_bytes()).hexdigest()
                for topic, ack in (
                    (ACK_TOPIC.format("dev-2"), CaptureAck(device_id="dev-2", sha256=sha256)),  # not its topic
                    (ACK_TOPIC.format("dev-1"), CaptureAck(device_id="dev-1", sha256="0" * 64)),  # not its file
                    (ACK_TOPIC.format("dev-1"), CaptureAck(device_id="dev-2", sha256=sha256)),  # not its id
                ):
                    forger.publish(topic, ack.model_dump_json().encode(), qos=1)
                ignored = "ignored an acknowledgement"
                assert until(lambda: agent.log().count(ignored) >= 2, 60), agent.log()[-3000:]
                assert unstored.exists()  # no forged ack deleted it

                service, url, viewer, operator, _db = start_service(tmp_path, broker)
                try:
                    path, image = put_capture(capture_dir, 2, operator_public)
                    local = path.read_bytes()

                    captures = until(lambda: listed_captures(url, viewer), 60)
                    assert [c["name"] for c in captures] == [path.name], agent.log()[-3000:]
                    status, downloaded = get(f"{url}/api/v1/captures/{captures[0]['id']}", operator)
                    assert status == 200 and downloaded == local
                    plain = open_sealed(downloaded, load_device_private_key(operator_private), source="download")
                    np.testing.assert_array_equal(unpack_record(plain, source="download").inputs["image"], image)
                    assert until(lambda: not path.exists(), 60), agent.log()[-3000:]  # deleted on the ack
                    assert unstored.exists()  # the service never got it: never acknowledged, kept
                finally:
                    service.terminate()
                    service.wait(30)
        finally:
            forger.stop()


def test_the_shipped_acl_keeps_a_devices_capture_acks_from_other_devices(tmp_path: Path) -> None:
    require_mosquitto()
    pki = make_test_pki(tmp_path / "pki", ["rpi-001", "rpi-002", "fleet-operator"])
    with shipped_broker(tmp_path / "broker", pki, DEVICE_PASSWORDS) as broker:
        service = shipped_client(broker, "operators", "service", "fleet-operator", "op")
        device = shipped_client(broker, "devices", "rpi-001", "rpi-001", DEVICE_PASSWORDS["rpi-001"])
        attacker = shipped_client(broker, "devices", "rpi-002", "rpi-002", DEVICE_PASSWORDS["rpi-002"])
        uploads: list[bytes] = []
        acks: list[bytes] = []
        snooped: list[tuple[str, bytes]] = []
        service.on_message = lambda topic, payload: uploads.append(payload)
        device.on_message = lambda topic, payload: acks.append(payload)
        attacker.on_message = lambda topic, payload: snooped.append((topic, payload))
        service.subscribe("edgesdk/devices/+/capture", qos=1)
        device.subscribe(ACK_TOPIC.format("rpi-001"), qos=1)
        attacker.subscribe(ACK_TOPIC.format("rpi-001"), qos=1)
        attacker.subscribe(ACK_TOPIC.format("rpi-002"), qos=1)  # its own: shows its subscriptions are made
        try:
            for client in (service, device, attacker):
                client.start()
                assert client.wait_connected(60), client.stats.last_error
            own = (ACK_TOPIC.format("rpi-002"), b"its own")
            assert until(lambda: service.publish(*own, qos=1) and own in snooped, 10)
            assert until(lambda: service.publish(ACK_TOPIC.format("rpi-001"), b"probe", qos=1) and acks, 10)
            acks.clear()
            attacker.publish(ACK_TOPIC.format("rpi-001"), b"forged", qos=1)
            attacker.publish(ACK_TOPIC.format("rpi-002"), b"forged", qos=1)  # not even its own
            attacker.publish("edgesdk/devices/rpi-002/capture", b"after the forgeries", qos=1)
            assert until(lambda: b"after the forgeries" in uploads, 10)  # the broker handled them in order
            service.publish(ACK_TOPIC.format("rpi-001"), b"genuine", qos=1)
            assert until(lambda: b"genuine" in acks, 10)
            assert set(acks) <= {b"probe", b"genuine"} and b"forged" not in acks
            assert {p for t, p in snooped if t == ACK_TOPIC.format("rpi-001")} == set()
        finally:
            for client in (service, device, attacker):
                client.stop()


def test_the_last_two_chunks_stored_at_once_by_two_workers_on_postgresql_make_one_file(tmp_path: Path) -> None:
    """Two ingest workers on one PostgreSQL database (a shared subscription splits a file's chunks
    between them) each store one of the last two chunks in transactions open at the same time:
    the file is stored once, whole (the second waits for the first, then sees both chunks)."""
    import threading

    from edgesdk.capture.upload import upload_message
    from edgesdk.fleet.service.captures import CapturePart, CaptureStore, list_captures, read_capture
    from edgesdk.fleet.service.database import Transaction, migrate, open_engine
    from tests.pg_helpers import throwaway_cluster

    content = os.urandom(CHUNK_BYTES + 7)
    name = "20261206T000001.000000Z-000001-digits.edgecap"
    first, second = (upload_message("dev-a", name, "digits", content, i) for i in range(2))
    with throwaway_cluster() as cluster:
        engine = open_engine(cluster.create_database("fleet_capture_chunks"))
        migrate(engine)
        workers = [CaptureStore(engine), CaptureStore(engine)]
        results: list[Any] = []

        def store_second() -> None:
            with Transaction(engine) as db:
                results.append(workers[1].write(db, [], [CapturePart(second, second.chunk())]))

        with Transaction(engine) as db:
            results.append(workers[0].write(db, [], [CapturePart(first, first.chunk())]))
            other = threading.Thread(target=store_second)
            other.start()
            other.join(2)  # with nothing to wait for it finishes now, seeing only its own chunk
        other.join(30)
        listed = list_captures(engine, "dev-a")
        assert len(listed) == 1 and read_capture(engine, listed[0]["id"])[1] == content  # type: ignore[index]
        assert sum(r.stored for r in results) == 1
        engine.dispose()
