"""The fleet path on a second broker implementation, clustered: RabbitMQ's MQTT plugin (Debian's
rabbitmq-server, 3.10: MQTT 3.1.1 only) as a two-node cluster on loopback, two real agent
processes on node 0 and the real ``edgesdk fleet serve`` on node 1. Presence, telemetry and a
rollout (deployment commands, chunk requests and frames, statuses) cross the cluster; a
SIGKILLed agent's Last Will reaches the service through the other node.

What RabbitMQ does differently, and how the fleet copes (docs/scaling.md):
* no MQTT 5 (it closes an MQTT 5 CONNECT unanswered): both sides fall back to 3.1.1 on their
  own (checked below from the service's log);
* no shared subscriptions: the service runs with ``--no-shared-subscriptions``, one ingest;
* retained messages are kept per node and sent only to exact-topic subscriptions, never to a
  wildcard like the service's ``devices/+/presence``: the service is started before the
  devices and learns presence live (its persistent session keeps what comes while it is away).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("onnxruntime")
pytest.importorskip("paho.mqtt")

from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from tests.agent_helpers import AgentProcess, run_agent_cli  # noqa: E402
from tests.ota_helpers import build_ota_bundles, make_mqtt_device  # noqa: E402
from tests.rabbitmq_helpers import RabbitCluster, find_rabbitmq  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DEVICES = ["rdev-0", "rdev-1"]


@pytest.fixture(scope="module")
def rabbit() -> Any:
    bin_dir = find_rabbitmq()
    if bin_dir is None:
        pytest.skip("rabbitmq-server is not installed (apt-get install rabbitmq-server; scripts/test installs it)")
    cluster = RabbitCluster(bin_dir, nodes=2).start()
    yield cluster
    cluster.stop()


def _wait(check: Any, what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_presence_telemetry_rollout_and_last_will_across_a_rabbitmq_cluster(
    rabbit: RabbitCluster, digits: Any, tmp_path: Path
) -> None:
    assert all(name in rabbit.running_nodes() for name in rabbit.names)  # one cluster, two nodes
    bundles = build_ota_bundles(digits, tmp_path / "bundles")
    db_url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "serve", "--broker", rabbit.mqtt_url(1)]
    argv += ["--db", db_url, "--operator-key", str(bundles.operator_key), "--data-dir", str(tmp_path / "svc")]
    argv += ["--no-shared-subscriptions", "--maintenance-interval", "1h"]
    log = tmp_path / "serve.log"
    serve = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, text=True)  # noqa: SIM115
    agents: dict[str, AgentProcess] = {}
    engine = open_engine(db_url)
    try:
        _wait(lambda: "fleet service on" in log.read_text() or serve.poll() is not None, "the service")
        assert serve.poll() is None, log.read_text()[-3000:]
        migrate(engine)
        for device_id in DEVICES:
            mqtt = {"enabled": True, "broker": rabbit.mqtt_url(0), "telemetry_interval_s": 2.0, "groups": ["line-1"]}
            device = make_mqtt_device(tmp_path / device_id, bundles, rabbit.mqtt_url(0), device_id=device_id, mqtt=mqtt)
            installed = run_agent_cli("install", "--config", str(device.config), str(bundles.v1))
            assert installed.returncode == 0, installed.stderr
            agents[device_id] = AgentProcess(device).start()

        def known() -> bool:
            with engine.connect() as db:
                devices = db.execute(schema.devices.select()).all()
                telemetry = {r.device_id for r in db.execute(schema.telemetry.select()).all()}
            online = {d.device_id for d in devices if d.online and json.loads(d.groups) == ["line-1"]}
            return online == set(DEVICES) and telemetry == set(DEVICES)

        _wait(known, "presence and telemetry of both devices in the service's database")

        submit = subprocess.run(
            [sys.executable, "-m", "edgesdk.cli.main", "fleet", "submit", str(bundles.v2), "--db", db_url,
             "--group", "line-1", "--canary", "50%", "--waves", "100%", "--probation", "1s",
             "--max-failures", "0%", "--deployment-id", "rabbit-1"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert submit.returncode == 0, submit.stderr

        def finished() -> Any:
            with engine.connect() as db:
                row = db.execute(schema.deployments.select().where(schema.deployments.c.id == "rabbit-1")).first()
            return row if row is not None and row.state in ("SUCCEEDED", "ABORTED", "ROLLED_BACK") else None

        row = _wait(finished, "the rollout through the cluster", timeout=240)
        assert row.state == "SUCCEEDED", (row.reason, log.read_text()[-3000:])
        for device_id, agent in agents.items():
            with urllib.request.urlopen(agent.url + "/v1/status", timeout=10) as response:
                assert json.loads(response.read())["model"]["release"] == 2, device_id

        agents["rdev-1"].stop(signal.SIGKILL)  # no goodbye: only the broker's Last Will says so

        def offline() -> bool:
            with engine.connect() as db:
                device = db.execute(schema.devices.select().where(schema.devices.c.device_id == "rdev-1")).one()
            return device.online is False

        _wait(offline, "rdev-1's Last Will through the other node", timeout=120)  # keepalive 30 s × 1.5
        # RabbitMQ 3.10 closes an MQTT 5 CONNECT without a CONNACK; the client tried 3.1.1 by itself.
        assert "trying MQTT 3.1.1" in log.read_text(), log.read_text()[-2000:]
    finally:
        for agent in agents.values():
            agent.stop()
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
        engine.dispose()
