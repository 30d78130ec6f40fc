"""The operator-signed re-provision command (issue 37), through a real agent process and a real
mosquitto: a device whose security state record was deleted refuses installs; an unsigned or
foreign-signed re-provision changes nothing; ``edgesdk fleet reprovision`` with the operator key
starts a fresh record at the floors it states, and installs are accepted again."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from edgesdk.agent.keyring import raw_key_id, read_device_public_key

from edgesdk.protocol.reprovision import Reprovision, sign_reprovision
from tests.agent_helpers import AgentProcess, run_agent_cli
from tests.mqtt_helpers import Collector
from tests.ota_helpers import OtaBundles, build_ota_bundles, make_mqtt_device

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paho.mqtt")
    return build_ota_bundles(digits, tmp_path_factory.mktemp("reprovision-bundles"))


def _status(agent: AgentProcess) -> dict:
    import urllib.request

    with urllib.request.urlopen(agent.url + "/v1/status", timeout=10) as response:
        return json.loads(response.read())


def _events(watch: Collector, name: str) -> list[dict]:
    return [e for e in watch.json("events") if e.get("event") == name]


def _forged(key_id: str, sign_with: Path | None) -> bytes:
    from edgesdk.keys import load_publisher_private_key

    now = datetime.now(timezone.utc)
    command = Reprovision(
        deployment_id="reprovision-forged",
        issued_at=now,
        expires_at=now + timedelta(minutes=5),
        sequence=int(now.timestamp() * 1000),
        targets=["dev-1"],
        key_id=key_id,
        release_floors={"digits": 0},
    )
    if sign_with is not None:
        command = sign_reprovision(command, load_publisher_private_key(sign_with))
    return command.model_dump_json().encode()


def test_a_tampered_device_is_reprovisioned_by_a_signed_command_and_not_by_a_forged_one(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker
) -> None:
    device = make_mqtt_device(tmp_path / "device", bundles, mqtt_broker.url)
    assert run_agent_cli("install", "--config", str(device.config), str(bundles.v1)).returncode == 0
    (device.data_dir / "security_state.json").unlink()  # tampered: the record deleted
    key_id = raw_key_id(read_device_public_key(bundles.keys.device_pub))
    watch = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/#", client_id="reprovision-watch")
    agent = AgentProcess(device).start()
    try:
        # Its port is open before its MQTT link is: a command (not retained) published before the
        # agent subscribed would be lost. It subscribes before it says it is online, so wait for that.
        assert watch.wait_for(lambda: any(p.get("online") for p in watch.json("presence")), 60), agent.log()
        assert _status(agent)["security_state"]["tampered"] is True
        refused = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundles.v2))
        assert refused.returncode != 0 and "security state" in refused.stderr, refused.stderr

        # Unsigned, and signed by a key the device does not trust: refused, nothing written.
        stranger = bundles.keys.directory / "stranger" / "publisher.key"
        for payload in (_forged(key_id, None), _forged(key_id, stranger)):
            watch.client.publish("edgesdk/devices/dev-1/ota/reprovision", payload, qos=1)
        assert watch.wait_for(lambda: len(_events(watch, "reprovision_refused")) >= 2, timeout=60), watch.json()
        whys = sorted(e["detail"]["why"] for e in _events(watch, "reprovision_refused"))
        assert whys == ["unknown_key", "unsigned"], whys
        assert not (device.data_dir / "security_state.json").exists()

        proc = subprocess.run(
            [sys.executable, "-m", "edgesdk.cli.main", "fleet", "reprovision", "dev-1", "--key-id", key_id,
             "--floor", "digits=1", "--operator-key", str(bundles.operator_key), "--broker", mqtt_broker.url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0 and "published reprovision-" in proc.stdout, proc.stderr
        assert watch.wait_for(lambda: bool(_events(watch, "security_state_reprovisioned")), timeout=60), agent.log()
        status = _status(agent)
        assert status["security_state"]["tampered"] is False, status["security_state"]
        assert status["security_state"]["release_floors"] == {"digits": 1}
        assert not [p for p in status["problems"] if p.startswith("security state")], status["problems"]
        accepted = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundles.v2))
        assert accepted.returncode == 0, accepted.stderr
    finally:
        agent.stop()
        watch.stop()
