"""``edgesdk fleet serve`` against the demo's embedded broker (amqtt, MQTT 3.1.1 only), the
broker ``scripts/demo`` starts on a machine without mosquitto (edgesdk issue 36).

amqtt never answers an MQTT 5 CONNECT, so the service's client must fall back to 3.1.1 on its
own, and a 3.1.1 broker has no shared subscriptions: the service ingests on plain ones (one
ingest process) and refuses ``--workers N`` in one line. Real processes: the broker
(``python -m edgesdk.demo.embedded_broker``) and ``edgesdk fleet serve``."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("amqtt", reason="the embedded broker is the 'demo' extra (pip install 'edgesdk[demo]')")
pytest.importorskip("paho.mqtt")
pytest.importorskip("sqlalchemy", reason="the fleet service is the 'fleet-service' extra")

from edgesdk.demo.processes import ProcessSet  # noqa: E402
from edgesdk.demo.story import _free_port, _port_open  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient  # noqa: E402
from edgesdk.schemas.messages import Presence, Telemetry  # noqa: E402

DEVICE = "dev-amqtt"


@pytest.fixture(scope="module")
def amqtt_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("amqtt") / "amqtt.log"
    port = _free_port()
    processes = ProcessSet()
    processes.start("broker", [sys.executable, "-m", "edgesdk.demo.embedded_broker", "--port", str(port)], log_file=log)
    try:
        deadline = time.monotonic() + 60
        while not _port_open(port):
            assert "broker" not in processes.exited() and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        processes.stop_all()


@pytest.fixture(scope="module")
def operator_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgesdk.keys import generate_publisher_key

    key, _public = generate_publisher_key(tmp_path_factory.mktemp("keys") / "operator")
    return key


def serve_argv(broker_url: str, db_url: str, data_dir: Path, namespace: str, key: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "edgesdk.cli.main", "fleet", "serve", "--broker", broker_url, "--db", db_url,
        "--data-dir", str(data_dir), "--namespace", namespace, "--operator-key", str(key), *extra,
    ]  # fmt: skip


def announce(broker_url: str, namespace: str) -> None:
    """A device's retained presence and one telemetry report, as an agent on amqtt sends them."""
    now = datetime.now(UTC)
    device = MqttClient(ClientOptions(client_id=DEVICE, broker_url=broker_url, protocol="3.1.1", clean_start=True))
    device.start()
    try:
        assert device.wait_connected(60), device.stats.last_error
        presence = Presence(device_id=DEVICE, online=True, ts=now, groups=["line-1"])
        telemetry = Telemetry(device_id=DEVICE, msg_id=uuid.uuid4().hex, seq=1, ts=now)
        base = f"{namespace}/devices/{DEVICE}"
        device.publish(f"{base}/presence", presence.model_dump_json().encode(), qos=1, retain=True)
        device.publish(f"{base}/telemetry", telemetry.model_dump_json().encode(), qos=1)
        deadline = time.monotonic() + 60
        while device.stats.acked < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert device.stats.acked == 2
    finally:
        device.stop()


@pytest.mark.parametrize("extra", [[], ["--no-shared-subscriptions"]], ids=["default", "no-shared-subscriptions"])
def test_fleet_serve_ingests_through_the_embedded_broker(
    amqtt_url: str, operator_key: Path, tmp_path: Path, extra: list[str]
) -> None:
    from edgesdk.fleet.service import schema
    from edgesdk.fleet.service.database import open_engine

    namespace = "plain" if extra else "shared"  # own service client id (and session) per case
    db_url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    log = tmp_path / "service.log"
    with log.open("w") as handle:
        proc = subprocess.Popen(
            serve_argv(amqtt_url, db_url, tmp_path, namespace, operator_key, *extra),
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
        )
    engine = None
    try:
        deadline = time.monotonic() + 60
        while "fleet service on" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        announce(amqtt_url, namespace)
        engine = open_engine(db_url)
        devices: list[str] = []
        reports: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (devices and reports):
            with engine.connect() as db:
                devices = [r.device_id for r in db.execute(schema.devices.select()).all()]
                reports = [r.device_id for r in db.execute(schema.telemetry.select()).all()]
            time.sleep(0.2)
        text = log.read_text()
        assert devices == [DEVICE] and reports == [DEVICE], text[-3000:]
        assert text.count("trying MQTT 3.1.1") == 1, text  # amqtt never answered the v5 CONNECT
        # Without --no-shared-subscriptions the service notices the broker has none, in one line.
        assert text.count("speaks MQTT 3.1.1 only: plain subscriptions") == (0 if extra else 1), text
        assert proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        if engine is not None:
            engine.dispose()


def test_fleet_serve_workers_on_the_embedded_broker_is_one_line_naming_the_fix(
    amqtt_url: str, operator_key: Path, tmp_path: Path
) -> None:
    """Workers share the ingest through MQTT 5 shared subscriptions, which a 3.1.1 broker lacks."""
    from tests.pg_helpers import throwaway_cluster

    with throwaway_cluster() as cluster:  # --workers needs PostgreSQL, checked before the broker
        db_url = cluster.create_database("workers_amqtt")
        proc = subprocess.run(
            serve_argv(amqtt_url, db_url, tmp_path, "workers", operator_key, "--workers", "2"),
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: --workers 2 needs MQTT 5 shared subscriptions"), proc.stderr
    assert "--workers 0" in lines[-1] and amqtt_url in lines[-1]
    assert sum(line.startswith("error:") for line in lines) == 1  # log lines before it, one error
