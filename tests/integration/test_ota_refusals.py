"""Refusals reach the operator in seconds, and cannot be forged (real ``edge-agent run``, a real
mosquitto, the real ``edgesdk fleet push|rollback`` and ``fleet serve`` processes).

* A push signed with an operator key the device does not trust ends non-zero within seconds,
  naming the device and "unknown key" (it used to wait for the wave timeout).
* A copy of a live rollout's command with a junk signature, and one signed by a key the device
  does not trust, published on the device's topic by someone on the broker: the device answers
  neither with a status for the deployment (only a rate-limited ``ota_refused`` event with the
  copy's digest), the service records a security event for each and the rollout commits.
* ``fleet rollback`` of a first install (nothing to roll back to) reports the device's answer
  and exits non-zero instead of printing ROLLED_BACK.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from edgesdk.mqtt.client import ClientOptions, MqttClient
from edgesdk.protocol.signing import command_digest, sign_deployment
from edgesdk.schemas.messages import Deployment
from tests.agent_helpers import AgentProcess, Device, run_agent_cli
from tests.mqtt_helpers import Collector
from tests.ota_helpers import OtaBundles, build_ota_bundles, make_mqtt_device

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paho.mqtt")
    return build_ota_bundles(digits, tmp_path_factory.mktemp("refusal-bundles"))


def _device(root: Path, bundles: OtaBundles, broker_url: str, *, installed: bool = True) -> Device:
    device = make_mqtt_device(root, bundles, broker_url)
    if installed:
        proc = run_agent_cli("install", "--config", str(device.config), str(bundles.v1))
        assert proc.returncode == 0, proc.stderr
    return device


def _online(broker_url: str, agent: AgentProcess) -> None:
    """Wait for dev-1's online presence: it subscribes before it announces itself, so a command
    published after this reaches it (commands are not retained)."""
    watch = Collector(broker_url, "edgesdk/devices/dev-1/presence", client_id=f"online-{time.monotonic_ns()}")
    try:
        assert watch.wait_for(lambda: any(p.get("online") for p in watch.json("presence")), 60), agent.log()[-2000:]
    finally:
        watch.stop()


def _release(agent: AgentProcess) -> int | None:
    with urllib.request.urlopen(agent.url + "/v1/status", timeout=10) as response:
        model = json.loads(response.read())["model"]
    return model["release"] if model else None


def _error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr + proc.stdout
    return lines[0]


@pytest.mark.parametrize("installed", [True, False], ids=["serving-v1", "no-model-yet"])
def test_a_push_signed_by_an_untrusted_operator_key_fails_within_seconds(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, edgesdk_cli, installed: bool
) -> None:
    """Serving or not (a device with no model yet used to answer nothing at all: the push sat at
    "sent 1" until the wave timeout), the device's refusal ends the push with its reason."""
    from edgesdk.keys import generate_publisher_key

    rogue_key, _ = generate_publisher_key(tmp_path / "rogue")
    device = _device(tmp_path / "dev", bundles, mqtt_broker.url, installed=installed)
    with AgentProcess(device) as agent:
        _online(mqtt_broker.url, agent)
        started = time.monotonic()
        try:
            push = edgesdk_cli(
                "fleet", "push", str(bundles.v2), "--devices", "dev-1", "--canary", "0%", "--waves", "100%",
                "--probation", "1s", "--deployment-id", "untrusted-1", "--broker", mqtt_broker.url,
                "--operator-key", str(rogue_key), "--db", str(tmp_path / "fleet.sqlite3"),
                timeout=30,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail("fleet push still waiting after 30 s (the wave timeout is probation + 10 minutes)")
        took = time.monotonic() - started
        assert push.returncode != 0, push.stdout + push.stderr
        error = _error_line(push)
        assert "dev-1" in error and "unknown key" in error and "untrusted-1" in error, error
        assert "refused by dev-1" in push.stdout, push.stdout  # said as soon as it arrived
        assert took < 20, f"push took {took:.1f} s"
        assert _release(agent) == (1 if installed else None)


def test_rollback_of_a_first_install_reports_the_device_answer_and_fails(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, edgesdk_cli
) -> None:
    device = _device(tmp_path / "dev", bundles, mqtt_broker.url, installed=False)
    common = ["--broker", mqtt_broker.url, "--operator-key", str(bundles.operator_key), "--db", str(tmp_path / "db")]
    with AgentProcess(device) as agent:
        _online(mqtt_broker.url, agent)
        push = edgesdk_cli(
            "fleet", "push", str(bundles.v1), "--devices", "dev-1", "--canary", "0%", "--waves", "100%",
            "--probation", "1s", "--deployment-id", "first-1", *common, timeout=120,
        )  # fmt: skip
        assert push.returncode == 0, push.stdout + push.stderr
        assert _release(agent) == 1
        rollback = edgesdk_cli("fleet", "rollback", "first-1", "--wait", "30s", *common, timeout=60)
        error = _error_line(rollback)
        assert rollback.returncode != 0, rollback.stdout
        assert "rollback of first-1 not done" in error and "dev-1" in error, error
        assert "no previous good slot" in error, error
        assert "ROLLED_BACK" not in rollback.stdout, rollback.stdout
        assert _release(agent) == 1  # the only model it has keeps serving


def _forgeries(command: Deployment, rogue_key: Path) -> list[bytes]:
    """Two copies of a real command: its signature's last bytes changed, and re-signed by a key
    the device does not trust (every signed field the same)."""
    from edgesdk.keys import load_publisher_private_key

    signature = command.signature or ""
    head, encoded = signature.rsplit(":", 1)
    junk = encoded[:-4] + ("AAA=" if not encoded.endswith("AAA=") else "BBB=")
    return [
        command.model_copy(update={"signature": f"{head}:{junk}"}).model_dump_json().encode(),
        sign_deployment(command, load_publisher_private_key(rogue_key)).model_dump_json().encode(),
    ]


def test_forged_copies_of_a_live_command_neither_fail_the_device_nor_abort_the_rollout(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker
) -> None:
    pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
    from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES, REFUSAL_OF_UNISSUED
    from edgesdk.fleet.rollout import RolloutPlan
    from edgesdk.fleet.service import schema
    from edgesdk.fleet.service.database import migrate, open_engine
    from edgesdk.fleet.service.ingest import read_counters
    from edgesdk.fleet.service.store import SqlRolloutStore
    from edgesdk.fleet.service.submit import submit_deployment
    from edgesdk.keys import generate_publisher_key

    rogue_key, _ = generate_publisher_key(tmp_path / "rogue")
    db_url = f"sqlite:///{tmp_path / 'service.sqlite3'}"
    engine = open_engine(db_url)
    migrate(engine)
    store = SqlRolloutStore(engine)
    device = _device(tmp_path / "dev", bundles, mqtt_broker.url)
    captured: list[Deployment] = []
    attacker = MqttClient(ClientOptions(client_id="attacker", broker_url=mqtt_broker.url, clean_start=True))
    attacker.on_message = lambda _topic, payload: captured.append(Deployment.model_validate_json(payload))
    attacker.subscribe("edgesdk/devices/dev-1/ota/deployment", qos=1)
    attacker.start()
    log = tmp_path / "service.log"
    service: subprocess.Popen[str] | None = None
    try:
        assert attacker.wait_connected(60)
        with AgentProcess(device) as agent, open(log, "w") as out:
            _online(mqtt_broker.url, agent)
            service = subprocess.Popen(
                [sys.executable, "-m", "tests.fleet_service_process", "--db", db_url, "--broker", mqtt_broker.url,
                 "--operator-key", str(bundles.operator_key), "--data-dir", str(tmp_path)],
                stdout=out, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=0.0, probation_s=6.0, wave_timeout_s=120)
            message = submit_deployment(store, bundles.v2, plan, devices=["dev-1"], deployment_id="live-1")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and store.devices("live-1")[0].state != "PROBATION":
                time.sleep(0.05)
            assert captured and store.devices("live-1")[0].state == "PROBATION", log.read_text()[-3000:]
            forged = _forgeries(captured[0], rogue_key)
            # In probation nothing else is reported for 6 s: a FAILED status for live-1 now would
            # stand in the service's record long enough to abort the rollout (it did before).
            for payload in forged:
                attacker.publish("edgesdk/devices/dev-1/ota/deployment", payload, qos=1)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and store.get(message.deployment_id).state not in FINISHED_ROLLOUT_STATES:
                time.sleep(0.2)
            summary = store.summary(message.deployment_id)
            assert summary["state"] == "SUCCEEDED", (summary, log.read_text()[-3000:])
            assert _release(agent) == 2
            digests = {command_digest(payload) for payload in forged}
            deadline = time.monotonic() + 60
            events: list[Any] = []
            while time.monotonic() < deadline and len(events) < 2:
                with engine.connect() as db:
                    events = db.execute(schema.security_events.select()).all()
                time.sleep(0.2)
            assert {e.command_sha256 for e in events} == digests, events
            assert all(e.kind == REFUSAL_OF_UNISSUED and e.deployment_id == "live-1" for e in events), events
            assert {e.why for e in events} == {"bad_signature", "unknown_key"}, events
            with engine.connect() as db:
                history = db.execute(
                    schema.ota_history.select().where(schema.ota_history.c.deployment_id == "live-1")
                ).all()
            assert history and "FAILED" not in {h.state for h in history}, history
            assert read_counters(engine, "db").get("security_events") == 2
    finally:
        if service is not None:
            service.terminate()
            service.wait(30)
        attacker.stop()
        engine.dispose()
