"""Bounds on the numbers of a correctly signed command, against a real ``edge-agent run`` and a
real mosquitto (issue 37, findings 7 and 9):

* a command whose ``sequence`` is 10**30 — signed by the operator key the device trusts — is
  refused as "sequence ahead of time" (it used to be accepted, and every later command of that
  key was then a "replay" until the key was rotated or the ledger deleted);
* a command valid for 3e9 s (until 2121) is refused as "validity too long" (the default cap is
  a week), and so is one valid for two days on a device configured with
  ``[ota] max_command_validity_s = 86400``;
* after these refusals, a normal rollout of the same operator key installs and commits.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from edgesdk.schemas.messages import HealthCriteria
from tests.agent_helpers import AgentProcess, run_agent_cli
from tests.mqtt_helpers import Collector
from tests.ota_helpers import Operator, OtaBundles, build_ota_bundles, make_deployment, make_mqtt_device

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paho.mqtt")
    return build_ota_bundles(digits, tmp_path_factory.mktemp("command-bounds-bundles"))


def _failed(watch: Collector, deployment_id: str) -> dict:
    """The FAILED status the agent publishes for the refused command ``deployment_id``."""

    def found() -> list[dict]:
        return [s for s in watch.json("ota/status") if s["deployment_id"] == deployment_id and s["state"] == "FAILED"]

    assert watch.wait_for(lambda: bool(found()), timeout=120), watch.json("ota/status")
    return found()[0]


def _refusal_event(watch: Collector, deployment_id: str) -> dict:
    def found() -> list[dict]:
        return [
            e["detail"]
            for e in watch.json("events")
            if e["event"] == "ota_refused" and e["detail"].get("deployment_id") == deployment_id
        ]

    assert watch.wait_for(lambda: bool(found()), timeout=120), watch.json("events")
    return found()[0]


def _online(watch: Collector, agent: AgentProcess) -> None:
    """Until dev-1 says it is online: its port opens before its MQTT link connects, and a command
    (not retained) published before it subscribed is lost; it subscribes before its presence."""
    assert watch.wait_for(lambda: any(p.get("online") for p in watch.json("presence")), 60), agent.log()[-3000:]


def _send(operator: Operator, bundles: OtaBundles, deployment_id: str, **fields: object) -> None:
    """A command signed by the operator key the device trusts, published on dev-1's topic."""
    command = make_deployment(bundles.v2, deployment_id, bundles.operator_key, **fields)  # type: ignore[arg-type]
    operator.client.publish("edgesdk/devices/dev-1/ota/deployment", command.model_dump_json().encode(), qos=1)


def _device(root: Path, bundles: OtaBundles, broker_url: str, **settings: object):
    device = make_mqtt_device(root, bundles, broker_url, **settings)
    installed = run_agent_cli("install", "--config", str(device.config), str(bundles.v1))
    assert installed.returncode == 0, installed.stderr
    return device


def test_a_far_ahead_sequence_and_a_century_of_validity_are_refused_and_the_key_keeps_working(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker
) -> None:
    device = _device(tmp_path / "device", bundles, mqtt_broker.url)
    watch = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/#", client_id="bounds-watch")
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    try:
        with AgentProcess(device) as agent:
            _online(watch, agent)
            attacks = [
                ("ahead-1", {"sequence": 10**30}, "sequence ahead of time", "sequence_ahead"),
                ("century-1", {"ttl_s": 3e9}, "validity too long", "validity_too_long"),
            ]
            for deployment_id, fields, needle, why in attacks:
                _send(operator, bundles, deployment_id, **fields)
                status = _failed(watch, deployment_id)
                assert needle in status["reason"], status
                assert _refusal_event(watch, deployment_id)["why"] == why
            century = _failed(watch, "century-1")["reason"]
            assert "604800 s ([ota] max_command_validity_s)" in century and "3e+09 s" in century, century
            assert "about 2**99" in _failed(watch, "ahead-1")["reason"]  # 10**30, not 31 digits of noise

            # The operator key is not locked out: a normal rollout installs and commits v2.
            deployment_id = operator.push(bundles.v2, HealthCriteria(probation_s=0.5))
            operator.thread.join(180)
            row = operator.device_row(deployment_id)
            assert row.state == "COMMITTED", (row, agent.log()[-3000:])
            with urllib.request.urlopen(agent.url + "/v1/status", timeout=10) as response:
                assert json.loads(response.read())["model"]["release"] == 2
    finally:
        operator.close()
        watch.stop()


def test_the_validity_cap_is_the_devices_config(tmp_path: Path, bundles: OtaBundles, mqtt_broker) -> None:
    device = _device(tmp_path / "device", bundles, mqtt_broker.url, ota={"max_command_validity_s": 86400})
    watch = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/#", client_id="cap-watch")
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    try:
        with AgentProcess(device) as agent:
            _online(watch, agent)
            _send(operator, bundles, "two-days-1", ttl_s=2 * 86400)  # within the default week
            reason = _failed(watch, "two-days-1")["reason"]
            assert "validity too long" in reason and "at most 86400 s" in reason, reason
    finally:
        operator.close()
        watch.stop()
