"""A capture upload in chunks survives the agent being SIGKILLed in its middle (issue 41), through
real processes: a real ``edge-agent run`` with ``[capture] upload = true``, a real mosquitto and
the service process on SQLite (tests/capture_helpers.py).

The kill lands at a chosen point, never by luck. The uploader hands a file's next chunk to the
outbox only once the broker acknowledged everything before it, so with the broker paused
(SIGSTOP) it hands exactly one chunk and waits: the kill comes after chunk 0 and before chunk 1.
With the service paused instead, the broker takes all seven chunks and holds them for it; pausing
the agent before the service resumes means the service stores the file and acknowledges it while
the agent cannot see the ack: the kill comes after the store and before the ack is read.

After the restart on the same data dir the service holds exactly the file's bytes, once; each
chunk went out as one message (a redelivery of that message may repeat it, never a second copy),
the device deletes the file on the ack, the ledger ends empty, and the agent logs no error."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")
pytest.importorskip("onnxruntime")

from edgesdk.capture.upload import chunks_of, upload_message  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient  # noqa: E402
from tests.agent_helpers import AgentProcess, Device  # noqa: E402
from tests.capture_helpers import (  # noqa: E402
    ACK_TOPIC,
    LEDGER,
    digits_device,
    fully_queued,
    get,
    ingest_counters,
    ledger_entries,
    listed_captures,
    put_capture,
    start_service,
    until,
    upload_config,
)
from tests.integration.conftest import require_mosquitto  # noqa: E402

pytestmark = [pytest.mark.integration]

CAPTURE_TOPIC = "edgesdk/devices/dev-1/capture"


class Watcher:
    """An MQTT client that records every chunk message of dev-1's uploads and every ack to it."""

    def __init__(self, broker: MosquittoBroker) -> None:
        self.chunks: dict[int, set[str]] = defaultdict(set)  # chunk index -> msg_ids seen
        self.acks: list[str] = []  # sha256 of each ack
        self.client = MqttClient(ClientOptions(client_id=f"watcher-{uuid.uuid4().hex[:8]}", broker_url=broker.url))
        self.client.on_message = self._on_message
        self.client.subscribe(CAPTURE_TOPIC, qos=1)
        self.client.subscribe(ACK_TOPIC.format("dev-1"), qos=1)

    def _on_message(self, topic: str, payload: bytes) -> None:
        message = json.loads(payload)
        if topic == CAPTURE_TOPIC:
            self.chunks[message["index"]].add(message["msg_id"])
        else:
            self.acks.append(message["sha256"])

    def __enter__(self) -> Watcher:
        self.client.start()
        assert self.client.wait_connected(10), self.client.stats.last_error
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.stop()


@contextmanager
def paused(pid: int | None) -> Iterator[None]:
    """The process ``pid`` stopped (SIGSTOP) for the block, resumed after it whatever happens."""
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def outbox_depth(device: Device) -> int:
    """Messages in the agent's store-and-forward outbox not yet acknowledged by the broker."""
    with sqlite3.connect(device.data_dir / "mqtt" / "outbox.sqlite3", timeout=30) as db:
        return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])


def wait_service_listening(broker: MosquittoBroker, url: str, viewer: str) -> None:
    """A small upload of another device is stored: the service's capture subscription is in place."""
    probe = upload_message("dev-probe", "20261206T000000.000000Z-000000-probe.edgecap", "probe", b"sealed")
    sender = MqttClient(ClientOptions(client_id=f"probe-{uuid.uuid4().hex[:8]}", broker_url=broker.url))
    sender.start()
    try:
        assert sender.wait_connected(10), sender.stats.last_error

        def stored() -> bool:
            sender.publish("edgesdk/devices/dev-probe/capture", probe.model_dump_json().encode(), qos=1)
            return bool(until(lambda: listed_captures(url, viewer, "dev-probe"), 2))

        assert until(stored, 60)
    finally:
        sender.stop()


def wait_linked(agent: AgentProcess, device: Device) -> None:
    """The agent is connected and its start's messages (presence, telemetry, events) acknowledged."""
    assert until(lambda: "MQTT connected" in agent.log(), 60), agent.log()[-3000:]
    assert until(lambda: outbox_depth(device) == 0, 60), agent.log()[-3000:]


def no_errors(*agents: AgentProcess) -> None:
    """No error (journald priority 3 or worse) and no traceback in the agents' logs."""
    for agent in agents:
        log = agent.log()
        bad = [line for line in log.splitlines() if line[:3] in ("<0>", "<1>", "<2>", "<3>") or "Traceback" in line]
        assert bad == [], log[-3000:]


@dataclass
class Rig:
    """One digits device with upload on, its broker, a watcher of its uploads and the service."""

    device: Device
    operator_public: Path
    broker: MosquittoBroker
    watcher: Watcher
    service: subprocess.Popen[str]
    url: str
    viewer: str
    operator: str
    db_url: str

    @property
    def capture_dir(self) -> Path:
        return self.device.data_dir / "capture"

    @property
    def ledger(self) -> Path:
        return self.capture_dir / LEDGER


@contextmanager
def rig(digits: Any, tmp_path: Path, request: Any) -> Iterator[Rig]:
    """The device, broker, watcher and service up, and the service's capture subscription in place."""
    require_mosquitto()
    device, _, operator_public = digits_device(digits, tmp_path, request)
    with MosquittoBroker(data_dir=tmp_path / "mosquitto") as broker, Watcher(broker) as watcher:
        upload_config(device, broker, operator_public)
        service, url, viewer, operator, db_url = start_service(tmp_path, broker)
        try:
            wait_service_listening(broker, url, viewer)
            yield Rig(device, operator_public, broker, watcher, service, url, viewer, operator, db_url)
        finally:
            service.terminate()
            service.wait(30)


def assert_stored_once(url: str, viewer: str, operator: str, db_url: str, path: Path, local: bytes) -> None:
    """The service lists exactly this file, once, with exactly its bytes."""
    captures = until(lambda: listed_captures(url, viewer), 60)
    assert [c["name"] for c in captures] == [path.name]
    status, downloaded = get(f"{url}/api/v1/captures/{captures[0]['id']}", operator)
    assert status == 200 and hashlib.sha256(downloaded).hexdigest() == hashlib.sha256(local).hexdigest()
    stored = until(lambda: (n := ingest_counters(db_url).get("capture_stored", 0)) >= 2 and n, 30)
    assert stored == 2  # this file, once, and wait_service_listening's probe


def test_a_capture_upload_killed_after_its_first_chunk_goes_on_from_the_next_after_a_restart(
    digits, tmp_path: Path, request: Any
) -> None:
    with rig(digits, tmp_path, request) as r:
        first = AgentProcess(r.device).start()
        try:
            wait_linked(first, r.device)
            with paused(r.broker.pid):  # no PUBACK: the uploader hands chunk 0 and waits for it
                assert outbox_depth(r.device) == 0
                path, _ = put_capture(r.capture_dir, 1, r.operator_public)
                local = path.read_bytes()
                sha256 = hashlib.sha256(local).hexdigest()
                assert until(lambda: ledger_entries(r.ledger), 30), first.log()[-3000:]
                first.stop(signal.SIGKILL)
            assert ledger_entries(r.ledger) == [(path.name, sha256, 0, chunks_of(len(local)))]  # in its middle
        finally:
            first.stop(signal.SIGKILL)
        with AgentProcess(r.device) as second:
            assert_stored_once(r.url, r.viewer, r.operator, r.db_url, path, local)
            assert until(lambda: not path.exists(), 30), second.log()[-3000:]  # deleted on the ack
            assert until(lambda: r.ledger.read_text() == "", 10), r.ledger.read_text()
        assert sorted(r.watcher.chunks) == list(range(chunks_of(len(local))))
        assert all(len(ids) == 1 for ids in r.watcher.chunks.values()), dict(r.watcher.chunks)  # none queued twice
        no_errors(first, second)


def test_a_capture_stored_while_the_agent_was_killed_before_its_ack_is_deleted_after_a_restart(
    digits, tmp_path: Path, request: Any
) -> None:
    with rig(digits, tmp_path, request) as r:
        first = AgentProcess(r.device).start()
        try:
            wait_linked(first, r.device)
            with paused(r.service.pid):  # the broker holds the chunks for it: nothing stored, no ack
                path, _ = put_capture(r.capture_dir, 1, r.operator_public)
                local = path.read_bytes()
                sha256 = hashlib.sha256(local).hexdigest()
                assert until(lambda: fully_queued(r.ledger, path.name) and outbox_depth(r.device) == 0, 60)
                os.kill(first.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            # the service stores the file and acks it; the paused agent cannot read the ack
            assert until(lambda: sha256 in r.watcher.acks, 60), (tmp_path / "service.log").read_text()[-3000:]
            first.stop(signal.SIGKILL)
            assert path.exists() and fully_queued(r.ledger, path.name)  # it never saw the ack
        finally:
            first.stop(signal.SIGKILL)
        with AgentProcess(r.device) as second:
            assert until(lambda: not path.exists(), 30), second.log()[-3000:]  # the ack, kept for it
            assert until(lambda: r.ledger.read_text() == "", 10), r.ledger.read_text()
            assert_stored_once(r.url, r.viewer, r.operator, r.db_url, path, local)
        assert all(len(ids) == 1 for ids in r.watcher.chunks.values()), dict(r.watcher.chunks)
        no_errors(first, second)
