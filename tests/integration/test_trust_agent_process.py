"""Signing roles tried as an attacker would: real ``edge-agent`` processes, a real mosquitto,
real Ed25519 keys and a root-signed trust document in the agent's config.

Each test names one attack: a model signed with the (online) operator key, a deployment signed
with a publisher key, a revoked publisher key used after a new document arrived over MQTT, an
older trust document replayed, a document from a foreign root, and an expired document."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgesdk.fleet.rollout import RolloutController, RolloutPlan
from edgesdk.fleet.service.operator_db import open_rollout_store
from edgesdk.keys import generate_publisher_key, key_id, load_publisher_private_key, load_publisher_public_key
from edgesdk.mqtt.client import ClientOptions, MqttClient
from edgesdk.protocol.signing import command_digest, command_payload
from edgesdk.protocol.topics import OTA_DEPLOYMENT, TRUST, device_topic, fleet_topic
from edgesdk.schemas.messages import HealthCriteria
from edgesdk.trust import document_bytes
from tests.agent_helpers import AgentProcess, Device, run_agent_cli, to_toml
from tests.mqtt_helpers import Collector
from tests.ota_helpers import OtaBundles, build_ota_bundles, make_deployment, make_mqtt_device
from tests.trust_helpers import make_root, trust_document, write_document

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paho.mqtt")
    from edgesdk.bundle import package_bundle

    built = build_ota_bundles(digits, tmp_path_factory.mktemp("trust-bundles"))
    root = built.v1.parent
    # The attacker holds the fleet server's operator key and signs a model with it.
    built.extra["by_operator"] = package_bundle(
        root / "convert",
        name="digits",
        version="1.1.0",
        release=2,
        publisher_key=built.operator_key,
        recipients=[built.keys.device_pub],
        out=root / "by-operator.edgepkg",
    )
    root_key, root_pub = make_root(root / "keys" / "root")
    foreign_key, foreign_pub = make_root(root / "keys" / "foreign-root")
    new_publisher_key, new_publisher_pub = generate_publisher_key(root / "keys" / "publisher-2")
    built.extra.update(
        root_key=root_key,
        root_pub=root_pub,
        foreign_key=foreign_key,
        foreign_pub=foreign_pub,
        new_publisher_pub=new_publisher_pub,
    )
    return built


def document(bundles: OtaBundles, version: int, *, publisher: Path | None = None, root: str = "root", **kw):
    return trust_document(
        version=version,
        root_pubs=[bundles.extra[f"{root}_pub"]],
        publisher_pubs=[publisher or bundles.keys.publisher_pub],
        operator_pubs=[bundles.operator_pub],
        signers=[bundles.extra[f"{root}_key"]],
        **kw,
    )


def make_device(root: Path, bundles: OtaBundles, broker_url: str, shipped: Path) -> Device:
    # The trust document alone says who signs what: no publisher_keys.
    device = make_mqtt_device(root, bundles, broker_url, publisher_keys=[], trust_document=str(shipped))
    proc = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundles.v1))
    assert proc.returncode == 0, proc.stderr
    return device


def status(agent: AgentProcess) -> dict:
    with urllib.request.urlopen(agent.url + "/v1/status", timeout=10) as response:
        return json.loads(response.read())


class Fleet:
    """The operator's side: publishes deployments and trust documents, watches the device."""

    def __init__(self, broker_url: str, root: Path) -> None:
        self.watch = Collector(broker_url, "edgesdk/devices/dev-1/#", client_id=f"watch-{time.monotonic_ns()}")
        self.client = MqttClient(ClientOptions(client_id=f"op-{time.monotonic_ns()}", broker_url=broker_url))
        self.client.start()
        assert self.client.wait_connected(60)
        self.root = root
        self.controller: RolloutController | None = None
        self.threads: list[threading.Thread] = []

    def rollout(self, bundle: Path, operator_key: Path) -> str:
        """A real rollout (the fleet's controller signs it and serves the chunks)."""
        if self.controller is None:
            store = open_rollout_store(self.root / "fleet.sqlite3")
            key = load_publisher_private_key(operator_key)
            self.controller = RolloutController(store, self.client, "edgesdk", key, poll_s=0.05).start()
        plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=1.0, probation_s=1.0, wave_timeout_s=240)
        message = self.controller.create(
            bundle, ["dev-1"], plan, health=HealthCriteria(probation_s=1), chunk_size=32 * 1024
        )
        thread = threading.Thread(target=self.controller.run, args=(message.deployment_id,), daemon=True)
        thread.start()
        self.threads.append(thread)
        return message.deployment_id

    def online(self, timeout: float = 60) -> None:
        """Wait for the device's online presence: the agent sends its subscriptions before it,
        so a deployment published after this reaches it (deployments are not retained)."""
        assert self.watch.wait_for(
            lambda: any(p.get("online") is True for p in self.watch.json("presence")), timeout
        ), self.watch.json("presence")

    def deploy(self, deployment) -> None:
        payload = command_payload(deployment)  # the bytes the fleet publishes (unused newer health fields left out)
        self.client.publish(device_topic("edgesdk", "dev-1", OTA_DEPLOYMENT), payload, qos=1)

    def push_trust(self, doc) -> None:
        self.client.publish(fleet_topic("edgesdk", TRUST), document_bytes(doc), qos=1, retain=True)

    def final_status(self, deployment_id: str, timeout: float = 120) -> dict:
        def final() -> list[dict]:
            return [
                s
                for s in self.watch.json("ota/status")
                if s.get("deployment_id") == deployment_id and s.get("state") in ("FAILED", "COMMITTED", "ROLLED_BACK")
            ]

        assert self.watch.wait_for(lambda: bool(final()), timeout), self.watch.json("ota/status")
        return final()[0]

    def event(self, name: str, timeout: float = 60) -> dict:
        def found() -> list[dict]:
            return [e for e in self.watch.json("events") if e.get("event") == name]

        assert self.watch.wait_for(lambda: bool(found()), timeout), [e.get("event") for e in self.watch.json("events")]
        return found()[0]

    def close(self) -> None:
        if self.controller is not None:
            self.controller.stop()
        for thread in self.threads:
            thread.join(30)
        self.watch.stop()
        self.client.stop()


@pytest.fixture
def fleet(mqtt_broker, tmp_path):
    fleet = Fleet(mqtt_broker.url, tmp_path)
    yield fleet
    fleet.close()


def test_bundle_signed_with_an_operator_key_is_refused(tmp_path, bundles, mqtt_broker) -> None:
    shipped = write_document(document(bundles, 1), tmp_path / "trust.json")
    device = make_device(tmp_path / "dev", bundles, mqtt_broker.url, shipped)
    proc = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundles.extra["by_operator"]))
    operator_id = key_id(load_publisher_public_key(bundles.operator_pub))
    assert proc.returncode == 1
    assert f"signed by unknown publisher key {operator_id}" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # The same key list WITHOUT a trust document (today's publisher_keys) lets it in: the split is what refuses.
    device.settings.pop("trust_document")
    device.settings["publisher_keys"] = [str(bundles.keys.publisher_pub), str(bundles.operator_pub)]
    device.config.write_text(to_toml(device.settings))
    proc = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundles.extra["by_operator"]))
    assert proc.returncode == 0, proc.stderr


def test_deployment_signed_with_a_publisher_key_is_refused(tmp_path, bundles, mqtt_broker, fleet) -> None:
    shipped = write_document(document(bundles, 1), tmp_path / "trust.json")
    device = make_device(tmp_path / "dev", bundles, mqtt_broker.url, shipped)
    with AgentProcess(device) as agent:
        fleet.online()
        forged = make_deployment(bundles.v2, "by-publisher", bundles.keys.publisher_key, chunk_size=32 * 1024)
        fleet.deploy(forged)
        # Not verified, so no status for its deployment id: an ota_refused event with its digest.
        refused = fleet.event("ota_refused")["detail"]
        publisher_id = key_id(load_publisher_public_key(bundles.keys.publisher_pub))
        assert refused["why"] == "unknown_key" and f"signed by unknown key {publisher_id}" in refused["reason"], refused
        assert refused["command_sha256"] == command_digest(command_payload(forged))
        assert status(agent)["model"]["release"] == 1
        # The control: the same bundle deployed by the operator (its key signs the deployment) installs.
        deployment_id = fleet.rollout(bundles.v2, bundles.operator_key)
        assert fleet.final_status(deployment_id)["state"] == "COMMITTED", agent.log()[-3000:]
        assert status(agent)["model"]["release"] == 2
        assert not [s for s in fleet.watch.json("ota/status") if s["deployment_id"] == "by-publisher"]


def test_revoked_publisher_key_is_refused_after_a_new_trust_document_over_mqtt(
    tmp_path, bundles, mqtt_broker, fleet
) -> None:
    shipped = write_document(document(bundles, 1), tmp_path / "trust.json")
    device = make_device(tmp_path / "dev", bundles, mqtt_broker.url, shipped)
    # Version 2 names only a new publisher key: the old one is revoked.
    revoking = document(bundles, 2, publisher=bundles.extra["new_publisher_pub"])
    with AgentProcess(device) as agent:
        fleet.push_trust(revoking)
        assert fleet.event("trust_updated")["detail"]["version"] == 2
        assert status(agent)["trust"]["version"] == 2
        assert json.loads((device.data_dir / "trust.json").read_text())["version"] == 2  # persisted
        assert status(agent)["model"]["release"] == 1  # what serves keeps serving
        refused = fleet.final_status(fleet.rollout(bundles.v2, bundles.operator_key))
        old_id = key_id(load_publisher_public_key(bundles.keys.publisher_pub))
        assert refused["state"] == "FAILED" and f"unknown publisher key {old_id}" in refused["reason"], refused
        assert status(agent)["model"]["release"] == 1


def test_deleting_trust_json_does_not_bring_back_a_revoked_publisher_key(tmp_path, bundles, mqtt_broker, fleet) -> None:
    """Issue 37, finding 2: with the agent stopped, ``rm data/trust.json`` made the image's first
    document the one in force again, and a bundle signed by the publisher key revoked since then
    installed and committed. The installed document lives in the security state record now:
    the file is restored from it. With the record deleted too, the device is tampered with and
    refuses the command."""
    shipped = write_document(document(bundles, 1), tmp_path / "trust.json")
    device = make_device(tmp_path / "dev", bundles, mqtt_broker.url, shipped)
    revoking = write_document(document(bundles, 2, publisher=bundles.extra["new_publisher_pub"]), tmp_path / "v2.json")
    proc = run_agent_cli("trust", "install", "--config", str(device.config), "--no-reload", str(revoking))
    assert proc.returncode == 0, proc.stderr
    (device.data_dir / "trust.json").unlink()
    with AgentProcess(device) as agent:
        assert status(agent)["trust"]["version"] == 2
        fleet.online()
        refused = fleet.final_status(fleet.rollout(bundles.v2, bundles.operator_key))
        old_id = key_id(load_publisher_public_key(bundles.keys.publisher_pub))
        assert refused["state"] == "FAILED" and f"unknown publisher key {old_id}" in refused["reason"], refused
        assert status(agent)["model"] is None  # v1 was signed by the revoked key too
    assert json.loads((device.data_dir / "trust.json").read_text())["version"] == 2  # restored
    (device.data_dir / "trust.json").unlink()
    (device.data_dir / "security_state.json").unlink()
    fleet.watch.clear()
    with AgentProcess(device) as agent:
        now = status(agent)
        assert now["security_state"]["tampered"] is True, now["security_state"]
        assert "security state" in fleet.event("security_state_tampered")["detail"]["reason"]
        fleet.online()
        deployment_id = fleet.rollout(bundles.v2, bundles.operator_key)

        def refusals() -> list[dict]:
            return [
                e
                for e in fleet.watch.json("events")
                if e.get("event") == "ota_refused" and "security state" in json.dumps(e.get("detail"))
            ]

        assert fleet.watch.wait_for(lambda: bool(refusals()), 60), agent.log()[-3000:]
        assert deployment_id in json.dumps(refusals()[0])
        assert not [s for s in fleet.watch.json("ota/status") if s.get("state") == "COMMITTED"]


@pytest.mark.parametrize("attack", ["rollback", "foreign-root"])
def test_trust_document_rollback_or_foreign_root_is_refused(tmp_path, bundles, mqtt_broker, fleet, attack) -> None:
    shipped = write_document(document(bundles, 1), tmp_path / "trust.json")
    device = make_device(tmp_path / "dev", bundles, mqtt_broker.url, shipped)
    v2 = write_document(document(bundles, 2), tmp_path / "trust-v2.json")
    proc = run_agent_cli("trust", "install", "--config", str(device.config), str(v2))  # the sideload route
    assert proc.returncode == 0, proc.stderr
    if attack == "rollback":
        bad, needle = document(bundles, 1), "version 1 is not newer than the trusted version 2"
    else:  # a self-consistent document from a root the device never trusted, with a higher version
        bad, needle = document(bundles, 3, root="foreign"), "signed by 0 of the trusted (version 2) root keys"
    with AgentProcess(device) as agent:
        fleet.push_trust(bad)
        refused = fleet.event("trust_refused")
        assert needle in refused["detail"]["reason"], refused
        assert status(agent)["trust"]["version"] == 2
    # By sideload too: one line, non-zero, the document in force unchanged.
    bad_file = write_document(bad, tmp_path / "bad.json")
    proc = run_agent_cli("trust", "install", "--config", str(device.config), str(bad_file))
    assert proc.returncode == 1 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert json.loads((device.data_dir / "trust.json").read_text())["version"] == 2


def test_expired_trust_document_is_reported_and_refuses_new_content(tmp_path, bundles, mqtt_broker, fleet) -> None:
    shipped = write_document(document(bundles, 1), tmp_path / "trust.json")
    device = make_device(tmp_path / "dev", bundles, mqtt_broker.url, shipped)
    past = datetime.now(timezone.utc) - timedelta(hours=1)
    write_document(document(bundles, 1, expires_at=past), shipped)  # the shipped file, now expired
    with AgentProcess(device) as agent:
        now = status(agent)
        assert now["trust"]["expired"] is True
        assert any("trust document version 1 expired" in p for p in now["problems"]), now["problems"]
        assert now["model"]["release"] == 1  # installed content goes on serving
        assert fleet.event("trust_expired")["detail"]["version"] == 1
        fleet.online()
        fleet.deploy(make_deployment(bundles.v2, "while-expired", bundles.operator_key, chunk_size=32 * 1024))
        # While its trust document has expired the device cannot verify any command, so the
        # message proves no sender: no status for its deployment id, an ota_refused event saying why.
        refused = fleet.event("ota_refused")["detail"]
        assert refused["deployment_id"] == "while-expired" and "expired" in refused["reason"], refused
        assert not [s for s in fleet.watch.json("ota/status") if s.get("deployment_id") == "while-expired"]
    proc = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundles.v2))
    assert proc.returncode == 1 and "expired" in proc.stderr


def test_with_a_trust_document_the_daemon_still_never_maps_the_crypto(tmp_path, bundles, mqtt_broker) -> None:
    """The helper checks the trust document and takes its publisher keys; the daemon only reads
    its fields. (Without MQTT: the link's presence still reads the device key today.)"""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/<pid>/maps (Linux) to see which libraries a process mapped")
    shipped = write_document(document(bundles, 1), tmp_path / "trust.json")
    device = make_device(tmp_path / "dev", bundles, mqtt_broker.url, shipped)
    device.settings["mqtt"] = {"enabled": False}
    device.config.write_text(to_toml(device.settings))
    with AgentProcess(device) as agent:
        assert status(agent)["model"]["release"] == 1
        mapped = Path(f"/proc/{agent.proc.pid}/maps").read_text()
        assert "onnxruntime" in mapped and "cryptography" not in mapped
    # A shipped document whose root signature does not hold opens nothing: the helper refuses it.
    tampered = json.loads(shipped.read_text())
    tampered["version"] = 9
    shipped.write_text(json.dumps(tampered))
    with AgentProcess(device) as agent:
        now = status(agent)
        assert now["model"] is None
        assert any("signed by 0 of its own root keys" in p for p in now["problems"]), now["problems"]


def test_trust_push_publishes_retained_for_devices_that_connect_later(tmp_path, bundles, mqtt_broker) -> None:
    import subprocess
    import sys

    path = write_document(document(bundles, 4), tmp_path / "trust.json")
    cli = [sys.executable, "-m", "edgesdk.cli.main", "trust", "push"]
    proc = subprocess.run([*cli, str(path), "--broker", mqtt_broker.url], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    late = Collector(mqtt_broker.url, "edgesdk/fleet/trust", client_id="late-device")  # subscribes afterwards
    try:
        assert late.wait_for(lambda: bool(late.json()), 60)
        assert late.json()[0]["version"] == 4
    finally:
        late.stop()
    tampered = json.loads(path.read_text())
    tampered["version"] = 5
    path.write_text(json.dumps(tampered))
    proc = subprocess.run([*cli, str(path), "--broker", mqtt_broker.url], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "signed by 0 of its own root keys" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
