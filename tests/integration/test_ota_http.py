"""Bundles over HTTP(S) with real processes: nginx from Debian serving the files, a real agent
(``edge-agent run``) doing the update, a real mosquitto and rollout controller sending the
signed deployment. Range and resume (nginx killed mid-download, then the agent), fallback
from a dead URL to a good one and to MQTT chunks, wrong bytes, a redirect to another host,
TLS against the fleet CA and a wrong CA; attacks: an oversize body, a tampered URL list."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgesdk.fleet.rollout import RolloutPlan
from edgesdk.schemas.messages import HealthCriteria
from tests.agent_helpers import AgentProcess, Device
from tests.integration.test_ota_agent_process import Operator, api_get, make_device
from tests.mqtt_helpers import Collector
from tests.nginx_helpers import Nginx, free_port, nginx_available
from tests.ota_helpers import OtaBundles, build_ota_bundles
from tests.pki_helpers import make_test_pki

pytestmark = pytest.mark.slow

CHUNK = 16 * 1024
Agents = list[AgentProcess]
FAST = HealthCriteria(probation_s=0.5)


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paho.mqtt")
    if not nginx_available():
        pytest.skip("nginx is not installed (apt-get install nginx)")
    return build_ota_bundles(digits, tmp_path_factory.mktemp("ota-http-bundles"))


@pytest.fixture()
def www(tmp_path: Path, bundles: OtaBundles) -> Path:
    root = tmp_path / "www"
    root.mkdir()
    (root / "v2.edgepkg").write_bytes(bundles.v2.read_bytes())
    return root


@contextlib.contextmanager
def _updating_device(
    root: Path, bundles: OtaBundles, broker_url: str, *, ota: dict[str, Any] | None = None
) -> Iterator[tuple[Device, Operator, Agents]]:
    """A device on release 1 (``[ota]`` settings from ``ota``) with its agent running, and an
    operator; stopped afterwards (a test that restarts the agent appends the new one)."""
    root.mkdir(parents=True, exist_ok=True)
    device = make_device(root / "device", bundles, broker_url)
    if ota is not None:
        device.write_config(**{**device.settings, "ota": ota})
    operator = Operator(root, bundles, broker_url)
    agents = [AgentProcess(device).start()]
    try:
        yield device, operator, agents
    finally:
        operator.close()
        agents[-1].stop()


def _push_http(operator: Operator, bundles: OtaBundles, *urls: str, mqtt_fallback: bool = False) -> str:
    return operator.push(bundles.v2, FAST, urls, mqtt_fallback=mqtt_fallback, chunk_size=CHUNK)


def _run(operator: Operator, deployment_id: str) -> object:
    operator.thread.join(240)
    return operator.device_row(deployment_id)


def _wait_progress(operator: Operator, deployment_id: str, at_least: float, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = operator.device_row(deployment_id)
        if row.progress is not None and row.progress >= at_least and row.state == "DOWNLOADING":
            return
        if row.state in ("FAILED", "COMMITTED", "ROLLED_BACK"):
            break
        time.sleep(0.05)
    raise AssertionError(f"no download progress {at_least} within {timeout} s: {operator.device_row(deployment_id)}")


def _ranges(nginx: Nginx) -> list[tuple[int, int]]:
    """(first byte asked for, body bytes sent) of each logged request for the bundle."""
    found = []
    for entry in nginx.entries():
        if entry.uri == "/v2.edgepkg" and entry.range.startswith("bytes="):
            found.append((int(entry.range[6:].split("-")[0]), entry.body_bytes))
    return found


def test_range_resume_after_nginx_is_killed_and_after_an_agent_restart(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, www: Path
) -> None:
    """nginx throttled to ~1/8 of the bundle per second is SIGKILLed mid-download and started
    again on the same port; later the agent is SIGKILLed and started again. Each time the next
    request's Range starts past what arrived, and nginx's access log adds up to about the
    bundle once: at most a chunk per cut was fetched twice."""
    size = bundles.v2.stat().st_size
    nginx = Nginx(tmp_path / "nginx", www, limit_rate=f"{max(4096, size // 8)}").start()
    with _updating_device(tmp_path, bundles, mqtt_broker.url) as (device, operator, agents):
        agent = agents[0]
        try:
            deployment_id = _push_http(operator, bundles, f"{nginx.url}/v2.edgepkg")
            _wait_progress(operator, deployment_id, 0.2)
            nginx.kill()  # the connection is cut; the agent tries the same server again
            nginx.start()
            _wait_progress(operator, deployment_id, 0.6)
            agent.stop(signal.SIGKILL)
            agent = AgentProcess(device).start()
            agents.append(agent)  # resumes DOWNLOADING from the partial file
            row = _run(operator, deployment_id)
            assert row.state == "COMMITTED", (row, agent.log()[-3000:])
            assert api_get(agent, "/v1/status")["model"]["release"] == 2
            logged = _ranges(nginx)
            # The request nginx was killed in is not logged; the one the agent was killed in and the
            # last one are, both resuming (never from byte 0), each further than the one before.
            assert len(logged) >= 2, nginx.entries()
            starts = [start for start, _ in logged]
            assert starts[0] > 0 and starts == sorted(starts) and len(set(starts)) == len(starts), logged
            last_start, last_sent = logged[-1]
            assert last_sent == size - last_start, logged
            wire = starts[0] + sum(sent for _, sent in logged)  # the unlogged first request sent >= starts[0]
            assert wire <= size + 2 * CHUNK + 64 * 1024, (wire, size, logged)
        finally:
            nginx.stop()


def test_a_dead_url_falls_back_to_the_next_then_to_mqtt_chunks(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, www: Path
) -> None:
    """[dead, nginx] installs from nginx without using MQTT; [dead, nginx 404] installs from
    the MQTT chunks the controller serves."""
    nginx = Nginx(tmp_path / "nginx", www).start()
    dead = f"http://127.0.0.1:{free_port()}/v2.edgepkg"
    try:
        with _updating_device(tmp_path / "first", bundles, mqtt_broker.url) as (_device, operator, agents):
            deployment_id = _push_http(operator, bundles, dead, f"{nginx.url}/v2.edgepkg", mqtt_fallback=True)
            row = _run(operator, deployment_id)
            assert row.state == "COMMITTED", (row, agents[0].log()[-3000:])
            assert operator.ctl.chunks.frames_sent == 0
            assert [sent for _, sent in _ranges(nginx)] == [bundles.v2.stat().st_size]
            assert "cannot reach 127.0.0.1" in agents[0].log()
        # Another device on the same broker: no URL delivers, the chunks do.
        with _updating_device(tmp_path / "second", bundles, mqtt_broker.url) as (_device, operator, agents):
            missing = f"{nginx.url}/missing.edgepkg"
            deployment_id = _push_http(operator, bundles, dead, missing, mqtt_fallback=True)
            row = _run(operator, deployment_id)
            assert row.state == "COMMITTED", (row, agents[0].log()[-3000:])
            assert operator.ctl.chunks.frames_sent >= bundles.v2.stat().st_size // CHUNK
            assert "falling back to MQTT chunks" in agents[0].log() and "HTTP 404" in agents[0].log()
    finally:
        nginx.stop()


def test_wrong_bytes_are_rejected_by_hash_and_the_served_model_is_kept(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, www: Path
) -> None:
    """nginx serves other bytes of the right size under the signed URL: the first chunk fails
    its hash, the source is dropped, the update FAILS (no fallback here) and v1 serves on."""
    size = bundles.v2.stat().st_size
    (www / "v2.edgepkg").write_bytes(os.urandom(size))
    nginx = Nginx(tmp_path / "nginx", www).start()
    with _updating_device(tmp_path, bundles, mqtt_broker.url) as (device, operator, agents):
        agent = agents[0]
        try:
            deployment_id = _push_http(operator, bundles, f"{nginx.url}/v2.edgepkg")
            row = _run(operator, deployment_id)
            assert row.state == "FAILED" and "chunk 0 is not the signed bundle's" in row.reason, row
            status = api_get(agent, "/v1/status")
            assert status["model"]["release"] == 1
            assert not (device.data_dir / "ota" / f"{deployment_id}.edgepkg").exists()
        finally:
            nginx.stop()


def test_a_redirect_to_another_host_is_refused_one_to_the_same_host_followed(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, www: Path
) -> None:
    port = free_port()
    extra = (
        f"location = /elsewhere.edgepkg {{ return 302 http://localhost:{port}/v2.edgepkg; }}\n"
        "        location = /moved.edgepkg { return 301 /v2.edgepkg; }"
    )
    nginx = Nginx(tmp_path / "nginx", www, port=port, extra=extra).start()
    with _updating_device(tmp_path, bundles, mqtt_broker.url) as (device, operator, agents):
        agent = agents[0]
        try:
            urls = (f"{nginx.url}/elsewhere.edgepkg", f"{nginx.url}/moved.edgepkg")
            deployment_id = _push_http(operator, bundles, *urls)
            row = _run(operator, deployment_id)
            assert row.state == "COMMITTED", (row, agent.log()[-3000:])
            assert f"redirect to another host (localhost:{port}) refused" in agent.log()
            # The refused redirect was never followed: localhost asked for nothing.
            assert [e.uri for e in nginx.entries()] == ["/elsewhere.edgepkg", "/moved.edgepkg", "/v2.edgepkg"]
        finally:
            nginx.stop()


def test_tls_against_the_fleet_ca_works_and_a_wrong_ca_is_refused(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, www: Path
) -> None:
    fleet = make_test_pki(tmp_path / "fleet-pki")
    other = make_test_pki(tmp_path / "other-pki")
    nginx = Nginx(tmp_path / "nginx", www, tls=(fleet.server_cert, fleet.server_key)).start()
    url = f"{nginx.url}/v2.edgepkg"
    with _updating_device(tmp_path, bundles, mqtt_broker.url, ota={"http_ca_file": str(other.ca_file)}) as (
        device,
        operator,
        agents,
    ):
        agent = agents[0]
        try:
            deployment_id = _push_http(operator, bundles, url)
            row = _run(operator, deployment_id)
            assert row.state == "FAILED" and "TLS with 127.0.0.1 failed" in row.reason, row
            assert "CERTIFICATE_VERIFY_FAILED" in row.reason, row
            assert nginx.entries() == []  # not one request went over the unverified connection
            agent.stop()
            device.write_config(**{**device.settings, "ota": {"http_ca_file": str(fleet.ca_file)}})
            agent = AgentProcess(device).start()
            agents.append(agent)
            deployment_id = _push_http(operator, bundles, url)
            row = _run(operator, deployment_id)
            assert row.state == "COMMITTED", (row, agent.log()[-3000:])
            assert api_get(agent, "/v1/status")["model"]["release"] == 2
        finally:
            nginx.stop()


class _Oversize(http.server.BaseHTTPRequestHandler):
    """Attacks the size cap: announces 64 times the signed size, or (``endless``) sends garbage
    without a length for as long as the device reads."""

    size = 0
    endless = False
    sent = 0

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        if not self.endless:
            self.send_header("Content-Length", str(64 * self.size))
        self.send_header("Connection", "close")
        self.end_headers()
        block = b"\xaa" * 65536
        try:
            while type(self).sent < 256 * self.size:
                self.wfile.write(block)
                type(self).sent += len(block)
        except OSError:
            return  # the device hung up

    def log_message(self, *args: object) -> None:
        pass


def test_an_oversize_body_is_refused_and_never_read_past_the_signed_size(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker
) -> None:
    size = bundles.v2.stat().st_size
    _Oversize.size = size
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Oversize)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v2.edgepkg"
    with _updating_device(tmp_path, bundles, mqtt_broker.url) as (device, operator, agents):
        agent = agents[0]
        try:
            deployment_id = _push_http(operator, bundles, url)
            row = _run(operator, deployment_id)
            assert row.state == "FAILED" and f"announces {64 * size} bytes" in row.reason, row
            _Oversize.endless, _Oversize.sent = True, 0
            deployment_id = _push_http(operator, bundles, url)
            row = _run(operator, deployment_id)
            assert row.state == "FAILED" and "chunk 0 is not the signed bundle's" in row.reason, row
            part = device.data_dir / "ota" / f"{deployment_id}.part"
            assert not part.exists() or part.stat().st_size == size  # the reservation, never more
            assert api_get(agent, "/v1/status")["model"]["release"] == 1
        finally:
            server.shutdown()
            server.server_close()


def test_a_tampered_url_list_is_refused_by_its_signature(tmp_path: Path, bundles: OtaBundles, mqtt_broker) -> None:
    """An attacker on the broker rewrites a signed deployment's artifact_urls to its own server:
    the signature covers them, the device refuses before it downloads anything."""
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    watch = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/#", client_id="tamper-watch")
    heard = len(watch.json("presence"))  # a retained presence of an earlier agent, if any
    agent = AgentProcess(device).start()
    try:
        # A first connect has no broker session yet: a command sent before the agent subscribes
        # is lost. It sends its subscriptions before its online presence, so wait for that.
        assert watch.wait_for(lambda: any(p["online"] for p in watch.json("presence")[heard:]), 60), agent.log()
        template = operator.ctl.create(
            bundles.v2,
            ["dev-1"],
            RolloutPlan(canary=0.0, waves=(1.0,)),
            deployment_id="tampered-1",
            artifact_urls=("https://cdn.example/v2.edgepkg",),
        )
        signed = operator.ctl.issue(template, ["dev-1"])
        forged = signed.model_copy(update={"artifact_urls": ["http://127.0.0.1:9/evil.edgepkg"]})
        operator.client.publish("edgesdk/devices/dev-1/ota/deployment", forged.model_dump_json().encode(), qos=1)

        def refusals() -> list[dict]:
            return [e["detail"] for e in watch.json("events") if e["event"] == "ota_refused"]

        assert watch.wait_for(lambda: bool(refusals()), timeout=60), watch.json("events")
        (refusal,) = refusals()  # an event with the forged copy's digest, no status for tampered-1
        assert refusal["why"] == "bad_signature" and "signature" in refusal["reason"], refusal
        assert refusal["command_sha256"] == hashlib.sha256(forged.model_dump_json().encode()).hexdigest()
        assert not [s for s in watch.json("ota/status") if s["deployment_id"] == "tampered-1"]
        assert not (device.data_dir / "ota" / "tampered-1.part").exists()
        assert api_get(agent, "/v1/status")["model"]["release"] == 1
    finally:
        watch.stop()
        operator.close()
        agent.stop()


def test_the_fleet_service_serves_its_rollouts_bundle_over_http_with_range(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker
) -> None:
    """A deployment submitted to a real ``fleet serve`` process (API on) with no URL of its own
    and no MQTT fallback: the service lists its /artifacts URL in the signed command, the agent
    downloads from it and commits; the route answers Range with 206 while the rollout runs and
    404 once it is over."""
    pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from edgesdk.fleet.service.database import migrate, open_engine
    from edgesdk.fleet.service.store import SqlRolloutStore
    from edgesdk.fleet.service.submit import submit_deployment

    db_url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    engine = open_engine(db_url)
    migrate(engine)
    store = SqlRolloutStore(engine)
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    service_dir = tmp_path / "service"
    service_dir.mkdir()
    argv = [sys.executable, "-m", "tests.fleet_service_process", "--db", db_url, "--broker", mqtt_broker.url]
    argv += ["--operator-key", str(bundles.operator_key), "--data-dir", str(service_dir), "--api", "127.0.0.1:0"]
    log = open(service_dir / "service.log", "w")  # noqa: SIM115 - the child owns it
    service = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        port_file = service_dir / "api.port"
        deadline = time.monotonic() + 60
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port_file.read_text()}/artifacts"
        plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=1.0, probation_s=2.0, wave_timeout_s=200)
        message = submit_deployment(
            store, bundles.v2, plan, devices=["dev-1"], health=HealthCriteria(probation_s=2.0), mqtt_fallback=False
        )
        url = f"{base}/{message.bundle_sha256}.edgepkg"
        ranged = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if ranged is None:
                try:
                    request = urllib.request.Request(url, headers={"Range": "bytes=10-19"})
                    with urllib.request.urlopen(request, timeout=10) as response:
                        ranged = (response.status, response.read(), response.headers["Content-Range"])
                except urllib.error.HTTPError:
                    pass  # not started yet
            if store.get(message.deployment_id).state in ("SUCCEEDED", "ABORTED", "ROLLED_BACK"):
                break
            time.sleep(0.2)
        row = store.devices(message.deployment_id)[0]
        assert row.state == "COMMITTED", (row, agent.log()[-3000:], (service_dir / "service.log").read_text()[-2000:])
        size = bundles.v2.stat().st_size
        assert ranged == (206, bundles.v2.read_bytes()[10:20], f"bytes 10-19/{size}"), ranged
        assert api_get(agent, "/v1/status")["model"]["release"] == 2
        with pytest.raises(urllib.error.HTTPError) as gone:
            urllib.request.urlopen(url, timeout=10)
        assert gone.value.code == 404  # served only while its rollout runs
    finally:
        service.terminate()
        service.wait(30)
        log.close()
        agent.stop()
        engine.dispose()
