"""The SIGKILL table with real agent processes and a real mosquitto: the agent (run by the
harness tests/faulty_agent.py, which starts it as ``edge-agent run`` does, with a FaultPlan) is
killed right after each update state is persisted, then started again as plain ``edge-agent run``.
It must end serving the old or the new model — never none — and the status it reported last
(recorded by the real rollout controller) must name what it serves. A full disk at the download
or the staging write is played the same way."""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from edgesdk.agent.ota.states import UpdateState

from edgesdk.keys import load_publisher_private_key
from edgesdk.schemas.messages import HealthCriteria
from tests.agent_helpers import AgentProcess, Device, agent_env, run_agent_cli
from tests.faulty_agent import faulty_agent_argv, faulty_agent_env
from tests.mqtt_helpers import Collector
from tests.ota_helpers import PROFILE, Operator, OtaBundles, build_ota_bundles, make_mqtt_device

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paho.mqtt")
    return build_ota_bundles(digits, tmp_path_factory.mktemp("ota-process-bundles"))


def make_device(root: Path, bundles: OtaBundles, broker_url: str) -> Device:
    device = make_mqtt_device(root, bundles, broker_url)
    proc = run_agent_cli("install", "--config", str(device.config), str(bundles.v1))
    assert proc.returncode == 0, proc.stderr
    return device


def api_get(agent: AgentProcess, path: str) -> dict:
    with urllib.request.urlopen(agent.url + path, timeout=10) as response:
        return json.loads(response.read())


def infer(agent: AgentProcess) -> list[float]:
    body = json.dumps({"inputs": {"image": [[[[0.0] * 8] * 8]]}}).encode()
    request = urllib.request.Request(
        agent.url + "/v1/models/digits/infer", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["outputs"]["logits"]


KILL_TABLE = [
    # (state the agent is killed in, deployment health, final state, release serving at the end)
    ("DOWNLOADING", HealthCriteria(probation_s=1), "COMMITTED", 2),
    ("VERIFYING", HealthCriteria(probation_s=1), "COMMITTED", 2),
    ("STAGED", HealthCriteria(probation_s=1), "COMMITTED", 2),
    ("ACTIVATING", HealthCriteria(probation_s=1), "ROLLED_BACK", 1),
    ("PROBATION", HealthCriteria(probation_s=1), "COMMITTED", 2),
    ("COMMITTED", HealthCriteria(probation_s=1), "COMMITTED", 2),
    ("ROLLING_BACK", HealthCriteria(probation_s=20, p95_latency_ms=0.001), "ROLLED_BACK", 1),
]


@pytest.mark.parametrize(("kill_at", "health", "final", "release"), KILL_TABLE, ids=[row[0] for row in KILL_TABLE])
def test_sigkill_at_every_persisted_state(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, kill_at: str, health: HealthCriteria, final: str, release: int
) -> None:
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    argv = faulty_agent_argv(device.config, kill_at=UpdateState(kill_at))
    first = AgentProcess(device, argv=argv, env=faulty_agent_env(agent_env())).start()
    second: AgentProcess | None = None
    try:
        assert api_get(first, "/v1/status")["model"]["release"] == 1
        deployment_id = operator.push(bundles.v2, health)
        first.proc.wait(120)
        assert first.proc.returncode == -9, first.log()  # killed by the fault plan, in that state
        state_file = json.loads((device.model_dir() / "ota" / "state.json").read_text())
        assert state_file["state"] == kill_at
        second = AgentProcess(device).start()
        # Serving again at once: the old or the new model, never none.
        assert api_get(second, "/v1/status")["model"]["release"] in (1, 2)
        operator.thread.join(240)
        row = operator.device_row(deployment_id)
        assert row.state == final, (row, second.log()[-3000:])
        status = api_get(second, "/v1/status")
        assert status["model"]["release"] == release == row.model_release  # the report is the truth
        assert status["updates"]["state"] == final
        assert len(infer(second)) == 1
    finally:
        operator.close()
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.parametrize("write", ["download", "stage"])
def test_disk_full_fails_the_update_and_the_old_model_serves_on(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, write: str
) -> None:
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    argv = faulty_agent_argv(device.config, disk_full=(write,))  # type: ignore[arg-type]
    agent = AgentProcess(device, argv=argv, env=faulty_agent_env(agent_env())).start()
    try:
        deployment_id = operator.push(bundles.v2, HealthCriteria(probation_s=1))
        operator.thread.join(240)
        row = operator.device_row(deployment_id)
        assert row.state == "FAILED", (row, agent.log()[-3000:])
        assert "No space left" in row.reason or "ENOSPC" in row.reason, row.reason
        assert row.model_release == 1
        status = api_get(agent, "/v1/status")
        assert status["model"]["release"] == 1 and status["updates"]["state"] == "FAILED"
        assert len(infer(agent)) == 1
        assert not list((device.model_dir() / "ota").glob("*.part")), "download leftovers not cleaned up"
    finally:
        operator.close()
        agent.stop()


def test_device_keeps_serving_through_an_update(tmp_path: Path, bundles: OtaBundles, mqtt_broker) -> None:
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    failures: list[str] = []
    releases: set[int] = set()
    stop = threading.Event()
    with AgentProcess(device) as agent:

        def client() -> None:
            while not stop.is_set():
                try:
                    assert len(infer(agent)) == 1
                except Exception as exc:  # noqa: BLE001 - every failed request counts
                    failures.append(repr(exc))

        def watch() -> None:
            while not stop.is_set():
                releases.add(api_get(agent, "/v1/status")["model"]["release"])
                time.sleep(0.05)

        threads = [threading.Thread(target=client), threading.Thread(target=watch)]
        for thread in threads:
            thread.start()
        try:
            deployment_id = operator.push(bundles.v2, HealthCriteria(probation_s=1))
            operator.thread.join(180)
            assert operator.device_row(deployment_id).state == "COMMITTED"
            deadline = time.monotonic() + 60  # the watch has seen release 2 (its polls run late when loaded)
            while 2 not in releases and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            operator.close()
    assert failures == []
    assert releases == {1, 2}


def test_bad_deployments_are_refused_and_reported(tmp_path: Path, bundles: OtaBundles, mqtt_broker) -> None:
    """Bad signature on the deployment, unsigned bundle publisher, other profile, older release,
    smoke-test failure: each ends FAILED with its reason, and v1 keeps serving."""
    from edgesdk.keys import generate_publisher_key
    from edgesdk.protocol.signing import sign_deployment

    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    with AgentProcess(device) as agent:
        try:
            cases = [
                (bundles.v5_untrusted_signer, "unknown publisher"),
                (bundles.v4_other_profile, PROFILE),
                (bundles.v3_bad_golden, "golden"),
            ]
            for bundle, needle in cases:
                deployment_id = operator.push(bundle, HealthCriteria(probation_s=1))
                operator.thread.join(120)
                row = operator.device_row(deployment_id)
                assert row.state == "FAILED" and needle in row.reason, row
                assert row.model_release == 1
            # Install v2, then offer v1 again: a rollback attack.
            operator.push(bundles.v2, HealthCriteria(probation_s=0.5))
            operator.thread.join(120)
            deployment_id = operator.push(bundles.v1, HealthCriteria(probation_s=0.5))
            operator.thread.join(120)
            row = operator.device_row(deployment_id)
            assert row.state == "FAILED" and "below this device's rollback floor" in row.reason, row
            # A deployment signed by a key the device does not trust is refused before download.
            rogue_key, _ = generate_publisher_key(tmp_path / "rogue")
            message = operator.ctl.store.get(deployment_id).message.model_copy(update={"deployment_id": "rogue-1"})
            forged = sign_deployment(message, load_publisher_private_key(rogue_key))
            refusals = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/#", client_id="rogue-watch")
            try:
                operator.client.publish(
                    "edgesdk/devices/dev-1/ota/deployment", forged.model_dump_json().encode(), qos=1
                )
                # Its signature proves no sender, so no status for "rogue-1": an ota_refused event
                # with the message's digest is the proof it was handled.
                assert refusals.wait_for(
                    lambda: any(e["event"] == "ota_refused" for e in refusals.json("events")), timeout=60
                ), refusals.json("events")
            finally:
                refusals.stop()
            (refusal,) = [e["detail"] for e in refusals.json("events") if e["event"] == "ota_refused"]
            assert refusal["why"] == "unknown_key" and "unknown key" in refusal["reason"], refusal
            assert refusal["deployment_id"] == "rogue-1"
            assert not [s for s in refusals.json("ota/status") if s["deployment_id"] == "rogue-1"]
            assert not (device.model_dir() / "ota" / "rogue-1.part").exists()
            status = api_get(agent, "/v1/status")
            assert status["model"]["release"] == 2
            assert status["updates"]["deployment_id"] == deployment_id
        finally:
            operator.close()


def _publish_to(operator: Operator, device_id: str, command) -> None:
    operator.client.publish(f"edgesdk/devices/{device_id}/ota/deployment", command.model_dump_json().encode(), qos=1)


def _refusal(watch: Collector, deployment_id: str, needle: str, *, after: int = 0) -> dict:
    """The FAILED status the agent publishes for a refused command (proof it was handled)."""

    def found() -> list[dict]:
        return [
            s
            for s in watch.json("ota/status")[after:]
            if s["deployment_id"] == deployment_id and s["state"] == "FAILED" and needle in s["reason"]
        ]

    assert watch.wait_for(lambda: bool(found()), timeout=60), watch.json("ota/status")[after:]
    return found()[0]


def test_replayed_stale_and_misaddressed_commands_are_refused(tmp_path: Path, bundles: OtaBundles, mqtt_broker) -> None:
    """Attacks on the command channel with correctly signed messages, against a real agent:
    a deployment replayed after a newer command, a rollback replayed, a command for another
    device, an expired one and one dated in the future; then the agent restarts and the replays
    are refused still. Each refusal is a FAILED status naming why, and the model serving stays."""
    from datetime import datetime, timedelta, timezone

    from edgesdk.keys import key_id
    from edgesdk.protocol.signing import sign_deployment

    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    sent = Collector(mqtt_broker.url, "edgesdk/devices/+/ota/+", client_id="attacker-tap")
    agent = AgentProcess(device).start()
    try:
        # The operator installs v2 (deployment A), then rolls it back; the attacker records both.
        install_a = operator.push(bundles.v2, HealthCriteria(probation_s=0.5))
        operator.thread.join(180)
        assert operator.device_row(install_a).state == "COMMITTED"
        operator.ctl.rollback(install_a)
        assert operator.ctl.wait_for_states(install_a, {"ROLLED_BACK"}, 60), operator.device_row(install_a)
        commands = [c for c in sent.json("ota/deployment") if c["deployment_id"] == install_a]
        captured_install = next(c for c in commands if c["action"] == "install")
        captured_rollback = next(c for c in commands if c["action"] == "rollback")
        assert captured_install["targets"] == ["dev-1"] and captured_install["wave"] == 0
        assert api_get(agent, "/v1/status")["model"]["release"] == 1

        # 1. The deployment replayed after a newer command (the rollback): refused as a replay.
        mark = len(sent.json("ota/status"))
        operator.client.publish("edgesdk/devices/dev-1/ota/deployment", json.dumps(captured_install).encode(), qos=1)
        refusal = _refusal(sent, install_a, "replay", after=mark)
        assert "not above the last accepted" in refusal["reason"], refusal

        # A newer deployment B commits v2 again, so the old rollback would have something to undo.
        install_b = operator.push(bundles.v2, HealthCriteria(probation_s=0.5))
        operator.thread.join(180)
        assert operator.device_row(install_b).state == "COMMITTED"

        # 2. The captured rollback replayed: refused as a replay; v2 keeps serving.
        mark = len(sent.json("ota/status"))
        operator.client.publish("edgesdk/devices/dev-1/ota/deployment", json.dumps(captured_rollback).encode(), qos=1)
        _refusal(sent, install_a, "replay", after=mark)

        # 3. A command for another device (dev-2), validly signed and fresh, on dev-1's topic.
        operator_key = load_publisher_private_key(bundles.operator_key)
        template = operator.ctl.store.get(install_b).message
        for_dev_2 = operator.ctl.issue(template, ["dev-2"], action="rollback")
        mark = len(sent.json("ota/status"))
        _publish_to(operator, "dev-1", for_dev_2)
        _refusal(sent, install_b, "not addressed to this device (dev-1)", after=mark)

        # 4. An expired command and 5. one issued in the future, each with a fresh sequence.
        signer = key_id(operator_key.public_key())
        now = datetime.now(timezone.utc)
        for issued, expires, needle in [
            (now - timedelta(hours=8), now - timedelta(hours=2), "expired"),
            (now + timedelta(hours=2), now + timedelta(hours=8), "not yet valid"),
        ]:
            stale = template.model_copy(
                update={
                    "action": "rollback",
                    "issued_at": issued,
                    "expires_at": expires,
                    "sequence": operator.ctl.store.next_sequence(signer),
                    "targets": ["dev-1"],
                }
            )
            mark = len(sent.json("ota/status"))
            _publish_to(operator, "dev-1", sign_deployment(stale, operator_key))
            _refusal(sent, install_b, needle, after=mark)
        status = api_get(agent, "/v1/status")
        assert status["model"]["release"] == 2  # nothing was rolled back
        assert status["updates"] == {**status["updates"], "deployment_id": install_b, "state": "COMMITTED"}

        # 6. Restart the agent: the sequence it accepted last is on disk; the replays stay refused.
        agent.stop()
        agent = AgentProcess(device).start()
        for captured in (captured_install, captured_rollback):
            mark = len(sent.json("ota/status"))
            operator.client.publish("edgesdk/devices/dev-1/ota/deployment", json.dumps(captured).encode(), qos=1)
            _refusal(sent, install_a, "replay", after=mark)
        assert api_get(agent, "/v1/status")["model"]["release"] == 2
        assert "refused deployment" in agent.log()
    finally:
        agent.stop()
        sent.stop()
        operator.close()


def test_replay_after_deleting_the_ledger_and_the_ota_state_is_refused(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker
) -> None:
    """Issue 37, finding 5: with the agent stopped, delete the command ledger and the model's
    update record, restart, replay a rolled-back deployment inside its validity: it committed
    again. The ledger lives in the security state record now, which those deletions leave."""
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    sent = Collector(mqtt_broker.url, "edgesdk/devices/+/ota/+", client_id="attacker-tap")
    agent = AgentProcess(device).start()
    try:
        install_a = operator.push(bundles.v2, HealthCriteria(probation_s=0.5))
        operator.thread.join(180)
        assert operator.device_row(install_a).state == "COMMITTED"
        operator.ctl.rollback(install_a)
        assert operator.ctl.wait_for_states(install_a, {"ROLLED_BACK"}, 60), operator.device_row(install_a)
        captured = next(
            c for c in sent.json("ota/deployment") if c["deployment_id"] == install_a and c["action"] == "install"
        )
        agent.stop()
        (device.data_dir / "ota" / "command_sequence.json").unlink(missing_ok=True)  # where it was kept before
        (device.model_dir() / "ota" / "state.json").unlink()
        agent = AgentProcess(device).start()
        assert api_get(agent, "/v1/status")["model"]["release"] == 1
        mark = len(sent.json("ota/status"))
        operator.client.publish("edgesdk/devices/dev-1/ota/deployment", json.dumps(captured).encode(), qos=1)
        refusal = _refusal(sent, install_a, "replay", after=mark)
        assert "not above the last accepted" in refusal["reason"], refusal
        assert api_get(agent, "/v1/status")["model"]["release"] == 1
    finally:
        agent.stop()
        sent.stop()
        operator.close()


def test_disk_full_mid_download_leaves_the_machine_idle_and_the_next_deployment_installs(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker
) -> None:
    """ENOSPC at the download (the FaultPlan, once): FAILED with the reason, the old model serves,
    the machine is at rest — and the next deployment (space back) is accepted and commits."""
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    argv = faulty_agent_argv(device.config, disk_full=("download",), disk_full_once=True)
    agent = AgentProcess(device, argv=argv, env=faulty_agent_env(agent_env())).start()
    try:
        first = operator.push(bundles.v2, HealthCriteria(probation_s=1))
        operator.thread.join(240)
        row = operator.device_row(first)
        assert row.state == "FAILED" and "ENOSPC" in row.reason, (row, agent.log()[-3000:])
        assert api_get(agent, "/v1/status")["model"]["release"] == 1
        second = operator.push(bundles.v2, HealthCriteria(probation_s=1))
        operator.thread.join(240)
        row = operator.device_row(second)
        assert row.state == "COMMITTED", (row, agent.log()[-3000:])
        status = api_get(agent, "/v1/status")
        assert status["model"]["release"] == 2 and status["updates"]["state"] == "COMMITTED"
        assert len(infer(agent)) == 1
    finally:
        operator.close()
        agent.stop()


class _Trickle(http.server.BaseHTTPRequestHandler):
    """Announces the whole bundle, then sends one byte every 2 s (slow retrieval)."""

    size = 0
    stop = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.send_header("Content-Length", str(self.size))
        self.end_headers()
        try:
            while not self.stop.wait(2.0):
                self.wfile.write(b"\0")
                self.wfile.flush()
        except OSError:
            return  # the agent hung up

    def log_message(self, *args: object) -> None:
        pass


def test_a_trickling_url_fails_the_update_within_its_deadline(tmp_path: Path, bundles: OtaBundles, mqtt_broker) -> None:
    """A server sending one byte every 2 s: FAILED with a reason that says too slow (test
    limits: 1 KB/s over 4 s, 20 s overall), the old model serves on, the machine is at rest."""
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    device.write_config(
        **{
            **device.settings,
            "ota": {
                "download_min_rate_bytes_s": 1000.0,
                "download_rate_window_s": 4.0,
                "download_deadline_min_s": 20.0,
                "download_deadline_max_s": 20.0,
            },
        }
    )
    _Trickle.size = bundles.v2.stat().st_size
    _Trickle.stop.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v2.edgepkg"
        deployment_id = operator.push(bundles.v2, HealthCriteria(probation_s=1), (url,), mqtt_fallback=False)
        operator.thread.join(240)
        row = operator.device_row(deployment_id)
        assert row.state == "FAILED", (row, agent.log()[-3000:])
        assert "too slow" in row.reason, row.reason
        status = api_get(agent, "/v1/status")
        assert status["model"]["release"] == 1 and status["updates"]["state"] == "FAILED"
    finally:
        _Trickle.stop.set()
        server.shutdown()
        server.server_close()
        operator.close()
        agent.stop()
