"""A real agent process through its life: config errors, sideload, a corrupted installed
bundle at start, reload on SIGHUP, precision switches under load, draining on SIGTERM, and
no vendor telemetry written under a fresh HOME."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, agent_env, make_device, run_agent_cli
from tests.conftest import assert_one_line_error

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def images(digits):
    return np.load(digits.validation)["image"][:4]


def install(device, bundle) -> None:
    proc = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundle))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("content", "env", "needles"),
    [
        ('device_id = "d"\n', {}, ["profile", "Field required"]),
        ('device_id = "d"\nprofile = "rpi5-8gb"\nbogus = 1\n', {}, ["bogus"]),
        ('device_id = "d"\nprofile = "rpi5-8gb"\n[api\n', {}, ["not valid TOML"]),
        ('device_id = "d"\nprofile = "rpi9"\n', {}, ["rpi9"]),
        ('device_id = "d"\nprofile = "rpi5-8gb"\n', {"EDGESDK_AGENT__API__PORT": "99999"}, ["api.port", "99999"]),
        ('device_id = "d"\nprofile = "rpi5-8gb"\n', {"EDGESDK_AGENT__API__MAX_QUEUE": "lots"}, ["max_queue", "lots"]),
    ],
)
def test_bad_config_is_one_clear_error(tmp_path, content, env, needles) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(content.replace('profile = "rpi5-8gb"\n', f'profile = "rpi5-8gb"\ndata_dir = "{tmp_path}/d"\n'))
    proc = run_agent_cli("run", "--config", str(config), env={**agent_env(), **env}, timeout=60)
    assert_one_line_error(proc, *needles)


def test_missing_config_file_and_missing_bundle(tmp_path) -> None:
    assert_one_line_error(run_agent_cli("run", "--config", str(tmp_path / "nope.toml")), "nope.toml", "not found")
    device = make_device(tmp_path / "dev")
    assert_one_line_error(
        run_agent_cli("install", "--config", str(device.config), str(tmp_path / "x.edgepkg")), "x.edgepkg"
    )


def test_tampered_bundle_is_refused_by_install(tmp_path, convert_dir) -> None:
    device = make_device(tmp_path / "dev")
    bundle = device.bundle(convert_dir, version="1.0.0", release=1)
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "tampered.edgepkg"
    bad.write_bytes(bytes(data))
    proc = run_agent_cli("install", "--config", str(device.config), str(bad))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert not (device.model_dir() / "slots" / "a" / "bundle.edgepkg").exists()


def payload_offset(device, bundle: Path, variant_id: str | None) -> tuple[int, int]:
    """File offset and length of one encrypted payload of ``bundle``: a variant's, or the golden set's."""
    from edgesdk.bundle import verify_bundle
    from edgesdk.keys import load_publisher_public_key

    verified = verify_bundle(bundle, trusted_publishers=[load_publisher_public_key(device.publisher_pub)])
    manifest = verified.manifest
    name = manifest.variant(variant_id).payload if variant_id else manifest.golden.payload
    location = next(p for p in manifest.encryption.payloads if p.name == name)
    return verified.payload_area_offset + location.offset, location.length


def rot(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("unseal", ["helper", "in_process"])
def test_corrupted_active_bundle_starts_on_last_good_one(tmp_path, convert_dir, images, unseal) -> None:
    device = make_device(tmp_path / "dev")
    device.write_config(unseal=unseal)
    install(device, device.bundle(convert_dir, version="1.0.0", release=1))
    install(device, device.bundle(convert_dir, version="2.0.0", release=2))
    store = json.loads((device.model_dir() / "store.json").read_text())
    assert store["active"] == "b" and store["previous"] == "a"
    broken = device.model_dir() / "slots" / "b" / "bundle.edgepkg"
    # Rot inside the fp32 variant, which the agent loads at start: decryption must catch it
    # (start-up does not re-hash the file; GCM and the signed plaintext hash do the work).
    offset, length = payload_offset(device, broken, "onnx-fp32")
    rot(broken, offset + length // 2)
    with AgentProcess(device) as agent, httpx.Client(base_url=agent.url) as client:
        status = client.get("/v1/status").json()
        assert status["model"]["version"] == "1.0.0"
        assert status["store"]["active_slot"] == "a"
        assert status["store"]["last_load"]["fell_back"] is True
        assert any("slot b" in p and "authentication" in p for p in status["problems"]), status["problems"]
        fallback = [e for e in status["recent_events"] if e["event"] == "bundle_fallback"]
        assert fallback and fallback[0]["slot"] == "a"
        r = client.post("/v1/models/digits/infer", json={"inputs": {"image": images.tolist()}})
        assert r.status_code == 200
    assert "started on last good slot a" in agent.log()


def test_the_daemon_opens_bundles_in_a_helper_and_never_maps_the_crypto(tmp_path, convert_dir, images) -> None:
    """``unseal = "helper"`` (the default): verifying and decrypting ran in a child process
    that is gone once the model serves; the daemon never mapped cryptography's library."""
    psutil = pytest.importorskip("psutil")
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/<pid>/maps (Linux) to see which libraries a process mapped")
    device = make_device(tmp_path / "dev")
    install(device, device.bundle(convert_dir, version="1.0.0", release=1))
    with AgentProcess(device) as agent, httpx.Client(base_url=agent.url) as client:
        assert client.get("/v1/status").json()["model"]["version"] == "1.0.0"
        r = client.post("/v1/models/digits/infer", json={"inputs": {"image": images.tolist()}})
        assert r.status_code == 200
        mapped = Path(f"/proc/{agent.proc.pid}/maps").read_text()
        assert "onnxruntime" in mapped  # the control: this is where a loaded library shows
        assert "cryptography" not in mapped
        assert psutil.Process(agent.proc.pid).children() == []  # the helper exited
    # The same start in process maps it: the check above can see the difference.
    device.write_config(unseal="in_process")
    with AgentProcess(device) as agent:
        assert "cryptography" in Path(f"/proc/{agent.proc.pid}/maps").read_text()


def test_a_helper_that_cannot_start_still_gets_the_model_served(tmp_path, convert_dir, monkeypatch) -> None:
    from edgesdk.agent.config import load_config
    from edgesdk.agent.daemon import Agent

    device = make_device(tmp_path / "dev")
    install(device, device.bundle(convert_dir, version="1.0.0", release=1))
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-python"))
    agent = Agent(load_config(device.config))
    assert agent.load_installed() is True
    assert agent.server.running_model().version == "1.0.0"
    assert any("cannot start the unseal helper" in p and "opened in process" in p for p in agent.problems)


def test_rot_in_a_payload_not_loaded_at_start_is_reported_by_the_background_check(tmp_path, convert_dir) -> None:
    device = make_device(tmp_path / "dev")
    install(device, device.bundle(convert_dir, version="1.0.0", release=1))
    bundle = device.model_dir() / "slots" / "a" / "bundle.edgepkg"
    offset, length = payload_offset(device, bundle, None)  # only the OTA smoke test reads it
    rot(bundle, offset + length // 2)
    with AgentProcess(device) as agent, httpx.Client(base_url=agent.url) as client:
        deadline = time.monotonic() + 60
        while not any(e["event"] == "bundle_damaged" for e in client.get("/v1/status").json()["recent_events"]):
            assert time.monotonic() < deadline, agent.log()
            time.sleep(0.1)
        status = client.get("/v1/status").json()
        # The model it loaded was authenticated byte for byte, so it keeps serving, and says so.
        assert status["model"]["version"] == "1.0.0"
        assert any("slot a: bundle file changed since it was installed" in p for p in status["problems"])


def test_sighup_reload_after_install_and_sigterm_drain(tmp_path, convert_dir, digits) -> None:
    device = make_device(tmp_path / "dev")
    install(device, device.bundle(convert_dir, version="1.0.0", release=1))
    big = np.repeat(np.load(digits.validation)["image"], 4, axis=0)[:4096]
    body = big.tobytes()
    headers = {"content-type": "application/x-edgesdk-tensors", "x-tensors": f"image=float32[{len(big)},1,8,8]"}
    with AgentProcess(device) as agent:
        proc = run_agent_cli(
            "install", "--config", str(device.config), str(device.bundle(convert_dir, version="2.0.0", release=2))
        )
        assert proc.returncode == 0, proc.stderr
        assert "running agent is loading it" in proc.stdout
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=agent.url) as client:
            while client.get("/v1/status").json()["model"]["version"] != "2.0.0":
                assert time.monotonic() < deadline, agent.log()
                time.sleep(0.2)

        results: list[tuple[object, float]] = []
        started = threading.Barrier(5)

        def client_loop() -> None:
            with httpx.Client(base_url=agent.url, timeout=30) as c:
                started.wait()
                for _ in range(50):
                    try:
                        status = c.post("/v1/models/digits/infer", content=body, headers=headers).status_code
                    except httpx.ConnectError:
                        results.append(("refused", time.time()))  # after the listener closed: expected
                        return
                    except httpx.TransportError as exc:  # dropped in the middle of a request: a failure
                        results.append((type(exc).__name__, time.time()))
                        return
                    results.append((status, time.time()))

        threads = [threading.Thread(target=client_loop) for _ in range(4)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.5)
        sigterm_at = time.time()
        code = agent.stop(signal.SIGTERM)
        for t in threads:
            t.join()
    assert code == 0, agent.log()
    outcomes = {outcome for outcome, _ in results}
    assert outcomes <= {200, "refused"}, results
    # Requests that were running when SIGTERM came were answered, not cut.
    assert any(outcome == 200 and at > sigterm_at for outcome, at in results), results
    assert "draining" in agent.log() and "stopped" in agent.log()
    assert not (device.data_dir / "api.port").exists()


def test_precision_switches_under_load_fail_no_request(tmp_path, convert_dir, images) -> None:
    device = make_device(tmp_path / "dev")
    trace = tmp_path / "trace.jsonl"
    # rpi5-8gb: step down at 76 °C, up at 67 °C. Hot and cool every 0.4 s for 60 s.
    trace.write_text(
        "\n".join(json.dumps({"at_s": i * 0.4, "temperatures_c": {"soc": 79.0 if i % 2 else 55.0}}) for i in range(150))
    )
    device.write_config(
        governor={"source": "trace", "trace_file": str(trace), "poll_interval_s": 0.05, "min_dwell_s": 0.1}
    )
    install(device, device.bundle(convert_dir, version="1.0.0", release=1))
    body = images.tobytes()
    headers = {"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[4,1,8,8]"}
    outcomes: list[tuple[int, str]] = []
    with AgentProcess(device) as agent:
        done = threading.Event()

        def client_loop() -> None:
            with httpx.Client(base_url=agent.url, timeout=30) as c:
                while not done.is_set():
                    r = c.post("/v1/models/digits/infer", content=body, headers=headers)
                    outcomes.append((r.status_code, r.headers.get("x-model-variant", "")))

        threads = [threading.Thread(target=client_loop) for _ in range(3)]
        for t in threads:
            t.start()
        # Under load until the governor has switched 4 times and both variants have answered (a
        # fixed 4 s could hold fewer switches on a loaded machine); the trace alternates for 60 s.
        deadline = time.monotonic() + 45
        with httpx.Client(base_url=agent.url, timeout=30) as client:
            while time.monotonic() < deadline:
                switched = client.get("/v1/status").json()["switch_count"] >= 4
                if switched and {variant for _, variant in outcomes} >= {"onnx-fp32", "onnx-int8"}:
                    break
                time.sleep(0.2)
        done.set()
        for t in threads:
            t.join()
        with httpx.Client(base_url=agent.url) as client:
            status = client.get("/v1/status").json()
            metrics = client.get("/metrics").text
    assert outcomes and {code for code, _ in outcomes} == {200}
    assert {variant for _, variant in outcomes} == {"onnx-fp32", "onnx-int8"}
    assert status["switch_count"] >= 4, status
    switches = [e for e in status["recent_events"] if e["event"] == "precision_switch"]
    assert switches and all(e["reason"].startswith("temperature") for e in switches)
    assert "edgesdk_agent_precision_switches_total" in metrics
    assert "precision switch onnx-fp32 -> onnx-int8 (temperature 79.0" in agent.log()


def test_no_vendor_telemetry_under_a_fresh_home_and_journald_lines(tmp_path, convert_dir, images, digits) -> None:
    from edgesdk.offline import telemetry_dirs

    home = tmp_path / "home"
    home.mkdir()
    device = make_device(tmp_path / "dev")
    device.write_config(log_format="journald")
    env = agent_env(home)
    proc = run_agent_cli(
        "install", "--config", str(device.config), str(device.bundle(convert_dir, version="1.0.0", release=1)), env=env
    )
    assert proc.returncode == 0, proc.stderr
    with AgentProcess(device, env=env) as agent, httpx.Client(base_url=agent.url) as client:
        for _ in range(20):
            assert (
                client.post("/v1/models/digits/infer", json={"inputs": {"image": images.tolist()}}).status_code == 200
            )
    for path in telemetry_dirs(home):
        assert not path.exists(), f"vendor telemetry wrote {path}"
    # No plaintext model on disk: no file the agent wrote holds a piece of the ONNX weights.
    plaintext = digits.onnx.read_bytes()
    probe = plaintext[len(plaintext) // 2 : len(plaintext) // 2 + 64]
    written = [p for p in [*device.data_dir.rglob("*"), *home.rglob("*")] if p.is_file()]
    assert written and not [p for p in written if probe in p.read_bytes()]
    lines = [line for line in agent.log().splitlines() if line.strip()]
    assert lines and all(line.startswith("<") and line[1] in "01234567" and line[2] == ">" for line in lines), lines
    assert any(line.startswith("<6>edgesdk.agent: edge-agent") for line in lines)


def test_key_and_status_commands(tmp_path, convert_dir) -> None:
    device = make_device(tmp_path / "dev")
    key = run_agent_cli("key", "--config", str(device.config))
    assert key.returncode == 0, key.stderr
    first, pem = key.stdout.split("\n", 1)  # `key id: <32 hex>`, then the PEM of device.pub
    assert first.startswith("key id: ") and len(first) == len("key id: ") + 32
    assert pem.strip() == device.device_pub.read_text().strip()
    assert_one_line_error(run_agent_cli("status", "--config", str(device.config)), "no running agent")
    install(device, device.bundle(convert_dir, version="1.0.0", release=1))
    with AgentProcess(device):
        status = run_agent_cli("status", "--config", str(device.config))
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["model"]["version"] == "1.0.0"


def test_start_problems_are_one_line_errors(tmp_path) -> None:
    import socket

    device = make_device(tmp_path / "dev")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        device.write_config(api={"port": taken.getsockname()[1]})
        assert_one_line_error(run_agent_cli("run", "--config", str(device.config)), "cannot listen", "127.0.0.1")
    (tmp_path / "bad.jsonl").write_text('{"at_s": 0, "temperature": 50}\n')
    device.write_config(governor={"source": "trace", "trace_file": str(tmp_path / "bad.jsonl")})
    assert_one_line_error(run_agent_cli("run", "--config", str(device.config)), "bad.jsonl", "unknown field")
    device.write_config(publisher_keys=[str(tmp_path / "missing.pub")])
    assert_one_line_error(run_agent_cli("run", "--config", str(device.config)), "missing.pub")
