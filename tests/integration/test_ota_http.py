"""Bundles over HTTP(S) with real processes: nginx from Debian serving the files, a real agent
(``edge-agent run``) doing the update, a real mosquitto and rollout controller sending the
signed deployment. Range and resume (nginx killed mid-download, then the agent), fallback
from a dead URL to a good one and to MQTT chunks, wrong bytes, a redirect to another host,
TLS against the fleet CA and a wrong CA; attacks: an oversize body, a tampered URL list."""

from __future__ import annotations

import http.server
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from edgesdk.fleet.rollout import RolloutPlan
from edgesdk.mqtt.certs import make_test_pki
from edgesdk.schemas.messages import HealthCriteria
from tests.agent_helpers import AgentProcess
from tests.integration.test_ota_agent_process import Operator, api_get, make_device
from tests.mqtt_helpers import Collector
from tests.nginx_helpers import Nginx, free_port, nginx_available
from tests.ota_helpers import OtaBundles, build_ota_bundles

pytestmark = pytest.mark.slow

CHUNK = 16 * 1024
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
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    try:
        deployment_id = operator.push(
            bundles.v2, FAST, (f"{nginx.url}/v2.edgepkg",), mqtt_fallback=False, chunk_size=CHUNK
        )
        _wait_progress(operator, deployment_id, 0.2)
        nginx.kill()  # the connection is cut; the agent tries the same server again
        nginx.start()
        _wait_progress(operator, deployment_id, 0.6)
        agent.stop(signal.SIGKILL)
        agent = AgentProcess(device).start()  # resumes DOWNLOADING from the partial file
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
        operator.close()
        agent.stop()
        nginx.stop()


def test_a_dead_url_falls_back_to_the_next_then_to_mqtt_chunks(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, www: Path
) -> None:
    """[dead, nginx] installs from nginx without using MQTT; [dead, nginx 404] installs from
    the MQTT chunks the controller serves."""
    nginx = Nginx(tmp_path / "nginx", www).start()
    dead = f"http://127.0.0.1:{free_port()}/v2.edgepkg"
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    try:
        deployment_id = operator.push(bundles.v2, FAST, (dead, f"{nginx.url}/v2.edgepkg"), chunk_size=CHUNK)
        row = _run(operator, deployment_id)
        assert row.state == "COMMITTED", (row, agent.log()[-3000:])
        assert operator.ctl.chunks.frames_sent == 0
        assert [sent for _, sent in _ranges(nginx)] == [bundles.v2.stat().st_size]
        assert "cannot reach 127.0.0.1" in agent.log()
    finally:
        operator.close()
        agent.stop()
    # A second device, the same broker: no URL delivers, the chunks do.
    device = make_device(tmp_path / "device-2", bundles, mqtt_broker.url)
    (tmp_path / "op-2").mkdir()
    operator = Operator(tmp_path / "op-2", bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    try:
        deployment_id = operator.push(bundles.v2, FAST, (dead, f"{nginx.url}/missing.edgepkg"), chunk_size=CHUNK)
        row = _run(operator, deployment_id)
        assert row.state == "COMMITTED", (row, agent.log()[-3000:])
        assert operator.ctl.chunks.frames_sent >= bundles.v2.stat().st_size // CHUNK
        assert "falling back to MQTT chunks" in agent.log() and "HTTP 404" in agent.log()
    finally:
        operator.close()
        agent.stop()
        nginx.stop()


def test_wrong_bytes_are_rejected_by_hash_and_the_served_model_is_kept(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, www: Path
) -> None:
    """nginx serves other bytes of the right size under the signed URL: the first chunk fails
    its hash, the source is dropped, the update FAILS (no fallback here) and v1 serves on."""
    size = bundles.v2.stat().st_size
    (www / "v2.edgepkg").write_bytes(os.urandom(size))
    nginx = Nginx(tmp_path / "nginx", www).start()
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    try:
        deployment_id = operator.push(
            bundles.v2, FAST, (f"{nginx.url}/v2.edgepkg",), mqtt_fallback=False, chunk_size=CHUNK
        )
        row = _run(operator, deployment_id)
        assert row.state == "FAILED" and "chunk 0 is not the signed bundle's" in row.reason, row
        status = api_get(agent, "/v1/status")
        assert status["model"]["release"] == 1
        assert not (device.data_dir / "ota" / f"{deployment_id}.edgepkg").exists()
    finally:
        operator.close()
        agent.stop()
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
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    try:
        urls = (f"{nginx.url}/elsewhere.edgepkg", f"{nginx.url}/moved.edgepkg")
        deployment_id = operator.push(bundles.v2, FAST, urls, mqtt_fallback=False, chunk_size=CHUNK)
        row = _run(operator, deployment_id)
        assert row.state == "COMMITTED", (row, agent.log()[-3000:])
        assert f"redirect to another host (localhost:{port}) refused" in agent.log()
        # The refused redirect was never followed: localhost asked for nothing.
        assert [e.uri for e in nginx.entries()] == ["/elsewhere.edgepkg", "/moved.edgepkg", "/v2.edgepkg"]
    finally:
        operator.close()
        agent.stop()
        nginx.stop()


def test_tls_against_the_fleet_ca_works_and_a_wrong_ca_is_refused(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, www: Path
) -> None:
    fleet = make_test_pki(tmp_path / "fleet-pki")
    other = make_test_pki(tmp_path / "other-pki")
    nginx = Nginx(tmp_path / "nginx", www, tls=(fleet.server_cert, fleet.server_key)).start()
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    device.write_config(**{**device.settings, "ota": {"http_ca_file": str(other.ca_file)}})
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    url = f"{nginx.url}/v2.edgepkg"
    try:
        deployment_id = operator.push(bundles.v2, FAST, (url,), mqtt_fallback=False, chunk_size=CHUNK)
        row = _run(operator, deployment_id)
        assert row.state == "FAILED" and "TLS with 127.0.0.1 failed" in row.reason, row
        assert "CERTIFICATE_VERIFY_FAILED" in row.reason, row
        assert nginx.entries() == []  # not one request went over the unverified connection
        agent.stop()
        device.write_config(**{**device.settings, "ota": {"http_ca_file": str(fleet.ca_file)}})
        agent = AgentProcess(device).start()
        deployment_id = operator.push(bundles.v2, FAST, (url,), mqtt_fallback=False, chunk_size=CHUNK)
        row = _run(operator, deployment_id)
        assert row.state == "COMMITTED", (row, agent.log()[-3000:])
        assert api_get(agent, "/v1/status")["model"]["release"] == 2
    finally:
        operator.close()
        agent.stop()
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
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    try:
        deployment_id = operator.push(bundles.v2, FAST, (url,), mqtt_fallback=False, chunk_size=CHUNK)
        row = _run(operator, deployment_id)
        assert row.state == "FAILED" and f"announces {64 * size} bytes" in row.reason, row
        _Oversize.endless, _Oversize.sent = True, 0
        deployment_id = operator.push(bundles.v2, FAST, (url,), mqtt_fallback=False, chunk_size=CHUNK)
        row = _run(operator, deployment_id)
        assert row.state == "FAILED" and "chunk 0 is not the signed bundle's" in row.reason, row
        part = device.data_dir / "ota" / f"{deployment_id}.part"
        assert not part.exists() or part.stat().st_size == size  # the reservation, never more
        assert api_get(agent, "/v1/status")["model"]["release"] == 1
    finally:
        operator.close()
        agent.stop()
        server.shutdown()
        server.server_close()


def test_a_tampered_url_list_is_refused_by_its_signature(tmp_path: Path, bundles: OtaBundles, mqtt_broker) -> None:
    """An attacker on the broker rewrites a signed deployment's artifact_urls to its own server:
    the signature covers them, the device refuses before it downloads anything."""
    device = make_device(tmp_path / "device", bundles, mqtt_broker.url)
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    agent = AgentProcess(device).start()
    watch = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/ota/status", client_id="tamper-watch")
    try:
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
        assert watch.wait_for(
            lambda: any(s["deployment_id"] == "tampered-1" for s in watch.json("ota/status")), timeout=30
        ), watch.json("ota/status")
        (refusal,) = [s for s in watch.json("ota/status") if s["deployment_id"] == "tampered-1"]
        assert refusal["state"] == "FAILED" and "signature" in refusal["reason"], refusal
        assert not (device.data_dir / "ota" / "tampered-1.part").exists()
        assert api_get(agent, "/v1/status")["model"]["release"] == 1
    finally:
        watch.stop()
        operator.close()
        agent.stop()
