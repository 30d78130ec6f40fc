"""Profiling at install, through a real agent: a committed model this device never measured is
timed by a low-priority child while the daemon serves, the figures reach /v1/status (and the
``profiled`` event), a new committed release is profiled again, and a child that fails is
reported once, with its reason, not retried in a loop."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, make_device, run_agent_cli

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")

FAST = {"on_install": True, "warmup": 1, "runs": 5}


def install(device, bundle) -> None:
    proc = run_agent_cli("install", "--config", str(device.config), "--no-reload", str(bundle))
    assert proc.returncode == 0, proc.stderr


def wait_profiling(client: Any, agent: AgentProcess, release: int, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = client.get("/v1/status").json()
        profiling = status["profiling"]
        if profiling.get("release") == release and profiling["state"] in ("done", "failed"):
            return status
        assert time.monotonic() < deadline, (profiling, agent.log())
        time.sleep(0.2)


def test_a_committed_model_is_profiled_in_the_background_and_again_after_an_update(
    tmp_path, convert_dir, digits
) -> None:
    device = make_device(tmp_path / "dev")
    device.write_config(profiling=FAST)
    install(device, device.bundle(convert_dir, version="1.0.0", release=1))
    image = np.load(digits.validation)["image"][:1]
    headers = {"content-type": "application/x-edgesdk-tensors", "x-tensors": "image=float32[1,1,8,8]"}
    with AgentProcess(device) as agent, httpx.Client(base_url=agent.url, timeout=30) as client:
        answered = []
        while client.get("/v1/status").json()["profiling"]["state"] == "running":
            # Serving is not blocked while the child times its own copy of each variant.
            answered.append(client.post("/v1/models/digits/infer", content=image.tobytes(), headers=headers))
            time.sleep(0.1)
        status = wait_profiling(client, agent, release=1)
        assert all(r.status_code == 200 for r in answered), [r.text for r in answered if r.status_code != 200]
        assert status["profiling"]["state"] == "done", status["profiling"]
        assert status["profiling"]["trigger"] == "start"
        measured = status["measured"]
        assert (measured["model"], measured["release"]) == ("digits", 1)
        assert {m["variant"] for m in measured["variants"]} == {"onnx-fp32", "onnx-int8"}
        assert all(m["runs"] == 5 and m["warmup"] == 1 for m in measured["variants"])
        # Every runtime of the profile installed here, onnxruntime at least, with its footprint.
        footprints = {r["runtime"]: r for r in measured["runtimes"]}
        assert "onnxruntime" in footprints and set(footprints) <= {"litert", "onnxruntime", "openvino"}
        assert footprints["onnxruntime"]["installed_mb"] > 1  # the wheel's files, as pip recorded them
        assert status["profiling"]["speed_ladder"] == measured["speed_ladder"]
        profiled = [e for e in status["recent_events"] if e["event"] == "profiled"]
        assert profiled and profiled[-1]["release"] == 1 and "p50_ms.onnx-fp32" in profiled[-1]
        # The governor's ladder is the measured one (reloaded when the measurement dropped a step).
        deadline = time.monotonic() + 60
        while (loaded := {v["id"] for v in client.get("/v1/status").json()["variants"] if v["loaded"]}) != set(
            measured["speed_ladder"]
        ):
            assert time.monotonic() < deadline, (loaded, measured["speed_ladder"], agent.log())
            time.sleep(0.2)

        # A new release, committed (sideload + SIGHUP): profiled again, by the model_loaded trigger.
        proc = run_agent_cli(
            "install", "--config", str(device.config), str(device.bundle(convert_dir, version="2.0.0", release=2))
        )
        assert proc.returncode == 0, proc.stderr
        status = wait_profiling(client, agent, release=2)
        assert status["profiling"]["state"] == "done" and status["measured"]["release"] == 2, status["profiling"]
    assert (device.data_dir / "measurements.json").exists()
    assert not list(device.data_dir.glob("*.tmp"))


def test_a_failing_profiling_child_is_reported_once_and_not_retried(tmp_path) -> None:
    from edgesdk.agent.install_profiling import InstallProfiler

    from edgesdk.schemas.agent_config import AgentConfig

    config = AgentConfig(device_id="d", profile="rpi5-8gb", data_dir=tmp_path, profiling=FAST)
    events: list[tuple[str, dict[str, Any]]] = []
    starts: list[int] = []

    def command() -> list[str]:
        starts.append(1)
        return [
            sys.executable,
            "-c",
            "import sys; sys.stdin.read(); print('profiling: no golden set', file=sys.stderr); sys.exit(1)",
        ]

    profiler = InstallProfiler(
        config,
        serving=lambda: ("digits", 3),
        committed=lambda: True,
        measured=lambda: None,
        on_measured=lambda figures: pytest.fail("nothing was measured"),
        emit=lambda name, detail: events.append((name, detail)),
        command=command,
    )
    assert profiler.consider("start") is True
    profiler.stop(timeout=60)  # joins the run (the child has ended by itself by then, or is killed)
    status = profiler.status()
    assert status["state"] == "failed", status
    assert status["reason"] in ("profiling: no golden set", "the profiling child exited with -9")
    assert events and events[-1][0] == "profiling_failed"
    # Not again for the same model and release (a model_loaded after a reload must not loop).
    profiler._stopping = False  # noqa: SLF001 - stop() above only joined the run
    assert profiler.consider("model_loaded") is False and len(starts) == 1


def test_nothing_is_profiled_on_probation_or_when_switched_off(tmp_path) -> None:
    from edgesdk.agent.install_profiling import InstallProfiler

    from edgesdk.schemas.agent_config import AgentConfig

    def profiler(committed: bool, on: bool) -> InstallProfiler:
        config = AgentConfig(device_id="d", profile="rpi5-8gb", data_dir=tmp_path, profiling={"on_install": on})
        return InstallProfiler(
            config,
            serving=lambda: ("digits", 3),
            committed=lambda: committed,
            measured=lambda: None,
            on_measured=lambda figures: None,
            emit=lambda name, detail: None,
            command=lambda: pytest.fail("no child may start"),
        )

    on_probation = profiler(committed=False, on=True)
    assert on_probation.consider("model_loaded") is False and on_probation.status()["state"] == "idle"
    off = profiler(committed=True, on=False)
    assert off.consider("start") is False and off.status() == {"state": "off"}


def test_an_update_is_profiled_when_it_commits_not_when_it_loads_on_probation(tmp_path) -> None:
    from edgesdk.agent.install_profiling import InstallProfiler

    from edgesdk.schemas.agent_config import AgentConfig

    config = AgentConfig(device_id="d", profile="rpi5-8gb", data_dir=tmp_path, profiling=FAST)
    committed = [False]
    started: list[str] = []

    def command() -> list[str]:
        started.append("child")
        return [sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"]

    profiler = InstallProfiler(
        config,
        serving=lambda: ("digits", 4),
        committed=lambda: committed[0],
        measured=lambda: None,
        on_measured=lambda figures: None,
        emit=lambda name, detail: None,
        command=command,
    )
    profiler.on_event("model_loaded", {"model": "digits", "release": 4})  # activated, on probation
    profiler.on_event("ota_state", {"state": "PROBATION"})
    assert started == [] and profiler.status()["state"] == "idle"
    committed[0] = True
    profiler.on_event("ota_state", {"state": "COMMITTED"})
    profiler.stop(timeout=60)
    assert started == ["child"] and profiler.status()["trigger"] == "ota_state"
    assert profiler.status()["reason"] in ("the profiling child exited with 3", "the profiling child exited with -9")
