"""Ingest that scales out, through real processes: ``edgesdk fleet serve --workers 2`` on a
throwaway PostgreSQL and a real mosquitto. The two workers share the telemetry subscription
(MQTT 5 shared subscriptions); one is SIGKILLed in the middle of a burst and the service
restarts it under the same id — every message the publisher got a PUBACK for is in the
database exactly once (acknowledged only after commit, redelivered from the worker's session,
de-duplicated by the database across workers). Two ``fleet serve`` instances on one database:
exactly one drives a rollout; SIGKILL it and the other takes over and resumes it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="paho-mqtt is part of the agent extra")

import sqlalchemy as sa  # noqa: E402

from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import read_counters  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker, find_mosquitto  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient  # noqa: E402
from edgesdk.schemas.messages import Telemetry  # noqa: E402
from tests.bundle_helpers import make_keys, write_convert_dir  # noqa: E402
from tests.pg_helpers import throwaway_cluster  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

_WORKER_STARTED = re.compile(r"ingest worker (\S+) started \(pid (\d+)\)")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: Any) -> Any:
    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto; scripts/test installs it)")
    broker = MosquittoBroker(data_dir=tmp_path_factory.mktemp("mosquitto")).start()
    yield broker
    broker.close()


@pytest.fixture(scope="module")
def postgres() -> Any:
    with throwaway_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def operator_key(tmp_path_factory: Any) -> Path:
    return make_keys(tmp_path_factory.mktemp("keys")).publisher_key


class Serve:
    """One real ``edgesdk fleet serve`` process, its output in a log file."""

    def __init__(self, root: Path, broker: Any, db_url: str, key: Path, *extra: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.log = root / "serve.log"
        argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "serve", "--broker", broker.url, "--db", db_url]
        argv += ["--operator-key", str(key), "--data-dir", str(root), "--maintenance-interval", "1h", *extra]
        self.proc = subprocess.Popen(argv, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, text=True)  # noqa: SIM115

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 60, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(re.findall(pattern, self.text())) >= count:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} (x{count}) in the service log:\n{self.text()[-4000:]}")

    def worker_pids(self) -> dict[str, int]:
        return {w: int(pid) for w, pid in _WORKER_STARTED.findall(self.text())}  # the newest pid per id wins

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _telemetry(device: str, seq: int) -> bytes:
    return (
        Telemetry(device_id=device, msg_id=f"{device}-{seq}", seq=seq, ts=datetime.now(timezone.utc))
        .model_dump_json()
        .encode()
    )


def publish(broker: Any, messages: list[tuple[str, bytes]], client_id: str) -> None:
    """Publish at QoS 1 as fast as the broker takes them; return once every PUBACK came."""
    client = MqttClient(ClientOptions(client_id=client_id, broker_url=broker.url, clean_start=True, max_inflight=500))
    client.start()
    assert client.wait_connected(10)
    for topic, payload in messages:
        client.publish(topic, payload, qos=1)
    deadline = time.monotonic() + 120
    while client.stats.acked < len(messages) and time.monotonic() < deadline:
        time.sleep(0.05)
    client.stop()
    assert client.stats.acked == len(messages), f"{client.stats.acked} of {len(messages)} acknowledged"


def _stored(engine: Any) -> tuple[int, int]:
    """(rows, distinct messages) in the telemetry table."""
    table = schema.telemetry
    with engine.connect() as db:
        rows = db.execute(sa.select(sa.func.count()).select_from(table)).scalar()
        distinct = db.execute(
            sa.select(sa.func.count()).select_from(sa.select(table.c.device_id, table.c.msg_id).distinct().subquery())
        ).scalar()
    return int(rows or 0), int(distinct or 0)


def _wait_stored(engine: Any, expected: int, serve: Serve, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _stored(engine)[1] >= expected:
            return
        time.sleep(0.2)
    raise AssertionError(f"{_stored(engine)} stored of {expected}:\n{serve.text()[-4000:]}")


def test_workers_share_the_stream_and_a_killed_worker_loses_nothing(
    broker: Any, postgres: Any, operator_key: Path, tmp_path: Path
) -> None:
    db_url = postgres.create_database("workers")
    serve = Serve(tmp_path / "serve", broker, db_url, operator_key, "--workers", "2")
    engine = open_engine(db_url)
    try:
        serve.wait_for(r"ingest worker w\d \(pid \d+\) on", count=2)  # both connected and subscribed
        devices = [f"sim-{i:03d}" for i in range(50)]
        burst = [(f"edgesdk/devices/{d}/telemetry", _telemetry(d, seq)) for seq in range(80) for d in devices]
        burst += burst[:200]  # QoS 1 duplicates and replays: stored once whichever worker gets them
        publisher = threading.Thread(target=publish, args=(broker, burst, "test-burst"))
        publisher.start()
        deadline = time.monotonic() + 60
        while _stored(engine)[0] < 600 and time.monotonic() < deadline:
            time.sleep(0.02)
        victim = serve.worker_pids()["w0"]
        subprocess.run(["kill", "-KILL", str(victim)], check=True)  # mid-burst: batches in flight, unacked
        publisher.join(180)
        serve.wait_for(r"ingest worker w0 started \(pid \d+\)", count=2)  # restarted under its id
        assert serve.worker_pids()["w0"] != victim
        _wait_stored(engine, 4000, serve)
        time.sleep(1.0)  # anything late would show up as an extra row below
        assert _stored(engine) == (4000, 4000)
    finally:
        serve.stop()  # each worker persists its last counts as it stops: nothing is left to land later

    # Shared, not duplicated: the next 1,000 messages reach a fresh pair of workers 1,000 times in
    # all. Counted between two stopped services, so no count is still on its way to the database.
    before = read_counters(engine, "test")
    tail_serve = Serve(tmp_path / "tail", broker, db_url, operator_key, "--workers", "2")
    try:
        tail_serve.wait_for(r"ingest worker w\d \(pid \d+\) on", count=2)
        tail = [(f"edgesdk/devices/{d}/telemetry", _telemetry(d, seq)) for seq in range(80, 100) for d in devices]
        publish(broker, tail, "test-tail")
        _wait_stored(engine, 5000, tail_serve)
    finally:
        tail_serve.stop()
        after = read_counters(engine, "test")
        engine.dispose()
    assert after["telemetry"] - before.get("telemetry", 0) == 1000, (before, after)
    assert after["messages"] - before["messages"] == 1000, (before, after)
    # Both workers took part (each logs what it ingested when stopped).
    shares = dict(re.findall(r"ingest worker (w\d) stopped after (\d+) message", tail_serve.text()))
    assert set(shares) == {"w0", "w1"} and all(int(n) > 0 for n in shares.values()), tail_serve.text()[-3000:]


def _small_bundle(root: Path, key: Path) -> Path:
    from edgesdk.bundle import package_bundle

    keys = make_keys(root / "device-keys")
    convert = write_convert_dir(root / "convert", {"onnx-fp32": {"model.onnx": b"\0" * 4096}})
    return package_bundle(
        convert, name="digits", version="1.1.0", release=11, publisher_key=key,
        recipients=[keys.device_pub], out=root / "b.edgepkg",
    )  # fmt: skip


def test_one_leader_drives_rollouts_and_another_takes_over_when_it_is_killed(
    broker: Any, postgres: Any, operator_key: Path, tmp_path: Path
) -> None:
    from edgesdk.fleet.rollout import RolloutPlan
    from edgesdk.fleet.service.store import SqlRolloutStore
    from edgesdk.fleet.service.submit import submit_deployment
    from edgesdk.schemas.messages import Deployment

    db_url = postgres.create_database("leaders")
    engine = open_engine(db_url)
    migrate(engine)
    commands: list[Deployment] = []
    watcher = MqttClient(ClientOptions(client_id="test-ghost", broker_url=broker.url, clean_start=True))
    watcher.on_message = lambda _t, payload: commands.append(Deployment.model_validate_json(payload))
    watcher.subscribe("edgesdk/devices/ghost-1/ota/deployment", qos=1)
    watcher.start()
    assert watcher.wait_connected(10)
    a = Serve(tmp_path / "a", broker, db_url, operator_key, "--instance", "a", "--workers", "1")
    a.wait_for("leader of namespace")
    b = Serve(tmp_path / "b", broker, db_url, operator_key, "--instance", "b")
    try:
        b.wait_for(r"fleet service on")
        plan = RolloutPlan(canary=0.0, waves=(1.0,), probation_s=1.0, wave_timeout_s=600.0, resend_s=3600.0)
        bundle = _small_bundle(tmp_path, operator_key)
        submit_deployment(SqlRolloutStore(engine), bundle, plan, devices=["ghost-1"], deployment_id="lead-1")
        a.wait_for(r"rollout wave_sent .*lead-1")
        deadline = time.monotonic() + 20
        while not commands and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [c.deployment_id for c in commands] == ["lead-1"]
        time.sleep(2.0)
        assert "leader of namespace" not in b.text() and "rollout wave" not in b.text(), b.text()[-2000:]

        a.proc.kill()  # its lock's connection dies with it
        a.proc.wait(10)
        b.wait_for("leader of namespace", timeout=60)
        b.wait_for(r"rollout wave_sent .*lead-1", timeout=60)  # resumed at the stored wave
        deadline = time.monotonic() + 20
        while len(commands) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(commands) == 2 and commands[1].sequence > commands[0].sequence  # never a replayed number
    finally:
        for serve in (a, b):
            serve.stop()
        watcher.stop()
        engine.dispose()


def test_ingest_workers_keep_at_most_max_pending_enrollments(
    broker: Any, postgres: Any, operator_key: Path, tmp_path: Path
) -> None:
    """Enrollment requests are a shared suffix, stored by the workers alone: they must enforce
    ``--max-pending-enrollments`` too (before, only the service's own ingest did, and a flood of
    new ids made a row each through the workers)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from edgesdk.agent.enrollment import enrollment_request

    db_url = postgres.create_database("pending")
    # A share group of its own: the earlier tests' worker sessions persist at this module's broker
    # and would take their round-robin share of the requests.
    extra = ("--workers", "1", "--max-pending-enrollments", "3", "--share-group", "pending-limit")
    serve = Serve(tmp_path / "serve", broker, db_url, operator_key, *extra)
    engine = open_engine(db_url)
    try:
        serve.wait_for(r"ingest worker w0 \(pid \d+\) on")
        requests = []
        for index in range(8):
            device_id = f"pending-{index}"
            raw = X25519PrivateKey.generate().public_key().public_bytes_raw()
            requests.append(
                (f"edgesdk/devices/{device_id}/enroll", enrollment_request(device_id, raw).model_dump_json().encode())
            )
        publish(broker, requests, "test-enroll-flood")
        deadline = time.monotonic() + 30
        counters = read_counters(engine, "edgesdk")
        while (
            counters.get("enroll_requests", 0) + counters.get("enroll_refused", 0) < 8 and time.monotonic() < deadline
        ):
            time.sleep(0.3)
            counters = read_counters(engine, "edgesdk")
        with engine.connect() as db:
            rows = db.execute(sa.select(sa.func.count()).select_from(schema.enrollment_requests)).scalar()
        assert (rows, counters.get("enroll_refused", 0)) == (3, 5), (counters, serve.text()[-3000:])
    finally:
        serve.stop()
        engine.dispose()
