"""The device side on arm64 (run by scripts/test-arm64; docs/devices.md): the provisioning image
for the lane's profile, built from this working tree, installed with no network on an arm64
Debian (a chroot under qemu-user, or the board itself), and its agent driven as the host process
tests drive theirs — against a real mosquitto here, with the operator's real CLI and rollout
controller. The chroot shares this machine's network namespace, so 127.0.0.1 is the same host.

Emulation makes everything slow and its timings say nothing about a device: the timeouts below
are generous and nothing measures speed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, Device
from tests.arm64.conftest import AGENT_IMPORTS, EXTRA_IMPORTS, LANE_DIR, DeviceSide
from tests.bundle_helpers import convert_digits_with_edgesdk, make_digits_convert_dir
from tests.integration.conftest import require_mosquitto

pytestmark = [pytest.mark.arm64, pytest.mark.slow]

DEVICE_ID = "pi-lane-1"
START_TIMEOUT = 600  # importing three runtimes under qemu takes tens of seconds
# A runtime's output on the device against the same runtime's on this machine: another CPU's
# kernels (NEON vs AVX) reorder float sums; the digits logits are O(10). OpenVINO's ARM CPU
# plugin infers even an fp32 variant in f16 by default (this machine's in f32): up to 0.05 apart
# here, the same top-1. (Forcing f32 under qemu 7.2 gave wrong answers: docs/devices.md.)
ATOL = {"onnxruntime": 1e-3, "litert": 1e-3, "openvino": 0.1}


# -- the operator's side ---------------------------------------------------------------------------


def http_json(url: str, body: dict | None = None, timeout: float = 60) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback
        return json.loads(response.read())


def wait_for(predicate: Any, timeout: float, what: str, agent: AgentProcess | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent is not None and agent.proc is not None and agent.proc.poll() is not None:
            raise AssertionError(
                f"agent exited with {agent.proc.returncode} waiting for {what}:\n{agent.log()[-4000:]}"
            )
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n{agent.log()[-4000:] if agent else ''}")


def runtime_subset(convert_dir: Path, runtime: str, out: Path) -> Path:
    """A copy of an ``edgesdk convert`` output with only ``runtime``'s variants (one bundle per
    runtime, so the agent serves each in turn)."""
    from edgesdk.schemas.report import ConversionReport

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(convert_dir, out)
    report = ConversionReport.model_validate_json((out / "report.json").read_text())
    kept = [v for v in report.variants if v.runtime.value == runtime]
    assert kept, f"the convert made no {runtime} variant: {[v.id for v in report.variants]}"
    (out / "report.json").write_text(report.model_copy(update={"variants": kept}).model_dump_json(indent=2))
    return out


def host_outputs(convert_dir: Path, variant_id: str, images: np.ndarray) -> np.ndarray:
    """The same artifact run by the same runtime on this machine: what the device must answer."""
    from edgesdk.runtimes import load_variant
    from edgesdk.schemas.report import ConversionReport

    report = ConversionReport.model_validate_json((convert_dir / "report.json").read_text())
    (variant,) = [v for v in report.variants if v.id == variant_id]
    files = {Path(f).name: (convert_dir / f).read_bytes() for f in variant.files}
    model = load_variant(variant.runtime.value, files)
    if isinstance(model.inputs[0].shape[0], int):  # a fixed batch of 1 (LiteRT)
        return np.concatenate([model.run({"image": images[i : i + 1]})["logits"] for i in range(len(images))])
    return model.run({"image": images})["logits"]


class Operator:
    """The fleet side in process: a real RolloutController over a real MQTT client."""

    def __init__(self, root: Path, operator_key: Path, broker_url: str) -> None:
        from edgesdk.fleet.rollout import RolloutController
        from edgesdk.fleet.service.operator_db import open_rollout_store
        from edgesdk.keys import load_publisher_private_key
        from edgesdk.mqtt.client import ClientOptions, MqttClient

        self.client = MqttClient(
            ClientOptions(client_id=f"op-{time.monotonic_ns()}", broker_url=broker_url, clean_start=True)
        )
        self.client.start()
        assert self.client.wait_connected(10)
        self.ctl = RolloutController(
            open_rollout_store(root / "fleet.sqlite3"), self.client, "edgesdk", load_publisher_private_key(operator_key),
            poll_s=0.1,
        ).start()  # fmt: skip
        self.result: dict[str, str] = {}
        self.thread: threading.Thread | None = None

    def push(self, bundle: Path, device_id: str, probation_s: float = 1.0, url: str | None = None) -> str:
        from edgesdk.fleet.rollout import RolloutPlan
        from edgesdk.schemas.messages import HealthCriteria

        plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=1.0, probation_s=probation_s, wave_timeout_s=900)
        message = self.ctl.create(
            bundle, [device_id], plan, health=HealthCriteria(probation_s=probation_s), chunk_size=32 * 1024,
            artifact_urls=(url,) if url else (), mqtt_fallback=url is None,
        )  # fmt: skip
        self.thread = threading.Thread(
            target=lambda: self.result.setdefault("state", self.ctl.run(message.deployment_id))
        )
        self.thread.start()
        return message.deployment_id

    def device_row(self, deployment_id: str) -> Any:
        self.ctl._drain_statuses()
        return self.ctl.store.devices(deployment_id)[0]

    def close(self) -> None:
        self.ctl.stop()
        if self.thread is not None:
            self.thread.join(60)
        self.client.stop()


# -- the device's side -----------------------------------------------------------------------------


def lane_device(root: Path, publisher_key: Path, publisher_pub: Path, **settings: Any) -> Device:
    """A device whose agent makes its own key on first start (data dir empty) and trusts one
    publisher key (which also signs the operator's deployments)."""
    data_dir = root / "data"
    data_dir.mkdir(parents=True, mode=0o700)
    device = Device(root, data_dir, publisher_key, publisher_pub, data_dir / "device.pub", root / "agent.toml")
    device.write_config(
        device_id=DEVICE_ID,
        profile=settings.pop("profile"),
        governor={"enabled": False, "source": "psutil"},
        **settings,
    )
    return device


def reconfigure(device: Device, **more: Any) -> None:
    """Rewrite the config with ``more`` on top of what it holds (write_config starts from defaults)."""
    device.write_config(**{**device.settings, **more})


def agent_on_device(
    side: DeviceSide, device: Device, *, module: str = "edgesdk.agent.cli", args: tuple[str, ...] = ()
) -> AgentProcess:
    """``edge-agent run`` (or the fault harness) on the device side; found through its api.port."""
    argv = side.argv(
        side.venv_python, "-m", module, *(("run",) if module == "edgesdk.agent.cli" else ()),
        "--config", str(device.config), *args,
        env={"PYTHONPATH": side.prefix + LANE_DIR, "HOME": str(device.root / "home")},
    )  # fmt: skip
    return AgentProcess(device, argv=argv, env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}, start_timeout=START_TIMEOUT)


def edgesdk(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def convert_all(digits, request) -> Path:
    """``edgesdk convert`` of the digits CNN for rpi5-8gb: onnx, tflite and openvino fp32 (cached)."""
    pytest.importorskip("ai_edge_litert")
    pytest.importorskip("openvino")
    cache = Path(request.config.cache.mkdir("edgesdk-arm64-convert-v1"))
    return convert_digits_with_edgesdk(digits, cache / "digits")


@pytest.fixture(scope="module")
def images(digits) -> np.ndarray:
    return np.load(digits.validation)["image"][:8]


# -- the tests -------------------------------------------------------------------------------------


def test_image_installs_offline_and_every_agent_import_works(device_side: DeviceSide, installed_image) -> None:
    assert installed_image["profile"] == device_side.profile and installed_image["arch"] == "aarch64"
    assert installed_image["python"] == device_side.python
    wheels = installed_image["wheels"]
    assert not any("x86_64" in w for w in wheels), wheels
    modules = [*AGENT_IMPORTS, *(EXTRA_IMPORTS[e] for e in device_side.extras)]
    probe = (
        "import importlib, json, platform, sys\n"
        "from edgesdk.offline import disable_vendor_telemetry\n"
        "disable_vendor_telemetry()\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps({'machine': platform.machine(), 'python': '%d.%d' % sys.version_info[:2]}))"
    )
    # No network here either: what the agent imports needs nothing from outside.
    imported = device_side.run(device_side.venv_python, "-c", probe, offline=True)
    assert imported.returncode == 0, imported.stderr[-3000:]
    facts = json.loads(imported.stdout.strip().splitlines()[-1])
    assert facts == {"machine": "aarch64", "python": device_side.python}
    # Beyond the list: every module of the device side imports there, offline (a module whose
    # optional extra is not in this image may fail only for that extra: gRPC, off by default).
    walk = (
        "import importlib, json, pkgutil\n"
        "from edgesdk.offline import disable_vendor_telemetry\n"
        "disable_vendor_telemetry()\n"
        "import edgesdk.agent, edgesdk.runtimes, edgesdk.protocol\n"
        "failed, done = {}, 0\n"
        "for package in (edgesdk.agent, edgesdk.runtimes, edgesdk.protocol):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        try:\n"
        "            importlib.import_module(info.name); done += 1\n"
        "        except ImportError as exc:\n"
        "            failed[info.name] = str(exc)\n"
        "print(json.dumps({'imported': done, 'failed': failed}))"
    )
    walked = device_side.run(device_side.venv_python, "-c", walk, offline=True)
    assert walked.returncode == 0, walked.stderr[-3000:]
    result = json.loads(walked.stdout.strip().splitlines()[-1])
    print(f"device-side modules imported offline: {result['imported']}, not: {result['failed']}")
    assert result["imported"] > 50 and "edgesdk.agent.install_profiling" not in result["failed"]
    assert all("grpc" in error for error in result["failed"].values()), result["failed"]
    check = device_side.run(device_side.venv_python, "-m", "pip", "check", offline=True)
    assert check.returncode == 0, check.stdout + check.stderr
    freeze = device_side.run(device_side.venv_python, "-m", "pip", "freeze", offline=True).stdout
    assert "edgesdk==" in freeze and "onnxruntime==" in freeze
    assert not re.search(r"^(torch|onnx|nncf|litert-torch)==", freeze, re.M), freeze  # no converter on a device
    # The control for "offline": in that namespace nothing is reachable, not even by address.
    reach = device_side.run(
        "/usr/bin/python3", "-c", "import socket; socket.create_connection(('151.101.0.223', 443), timeout=5)",
        offline=True,
    )  # fmt: skip
    assert reach.returncode != 0 and "Network is unreachable" in reach.stderr, reach.stderr


def test_enrolls_updates_over_mqtt_and_serves_each_runtime_like_the_host(
    device_side: DeviceSide, installed_image, lane_root: Path, mqtt_broker, convert_all: Path, images: np.ndarray
) -> None:
    """Enrollment, then one OTA deployment (MQTT chunks) per runtime of the profile; each is
    verified and decrypted in the agent's unseal helper and served; the answers equal this
    machine's for the same artifact; telemetry reports what serves."""
    from edgesdk.keys import generate_publisher_key, key_id, load_device_public_key
    from edgesdk.profiles import get_profile
    from edgesdk.schemas.messages import Telemetry
    from tests.mqtt_helpers import Collector

    require_mosquitto()
    publisher_key, publisher_pub = generate_publisher_key(lane_root / "publisher")
    device = lane_device(
        lane_root / "device", publisher_key, publisher_pub, profile=device_side.profile,
        mqtt={"enabled": True, "broker": mqtt_broker.url, "telemetry_interval_s": 1.0},
    )  # fmt: skip
    observer = Collector(mqtt_broker.url, f"edgesdk/devices/{DEVICE_ID}/#")
    agent = agent_on_device(device_side, device).start()
    try:
        url = agent.url
        status = http_json(f"{url}/v1/status")
        assert status["device_id"] == DEVICE_ID and status["model"] is None and status["link"] is True

        # Enrollment: the agent made its key pair on the device; the operator approves that key.
        device_public = load_device_public_key(device.data_dir / "device.pub")
        registry = ("--registry", str(lane_root / "enrollment.json"), "--broker", mqtt_broker.url)

        def offered() -> dict | None:
            listed = edgesdk("fleet", "enroll", "list", *registry, "--wait", "1", "--json")
            assert listed.returncode == 0, listed.stderr
            return {row["device_id"]: row for row in json.loads(listed.stdout)}.get(DEVICE_ID)

        row = wait_for(offered, 120, "the device to announce its key", agent)
        assert row["offered_key_id"] == key_id(device_public) and row["status"] == "pending"
        approved = edgesdk("fleet", "enroll", "approve", DEVICE_ID, *registry, "--key-id", key_id(device_public))
        assert approved.returncode == 0, approved.stderr

        # One deployment per runtime the profile lists, in the profile's order.
        runtimes = [r.runtime.value for r in get_profile(device_side.profile).runtimes]
        served: dict[str, str] = {}
        for release, runtime in enumerate(runtimes, start=1):
            subset = runtime_subset(convert_all, runtime, lane_root / f"convert-{runtime}")
            bundle = lane_root / f"digits-{runtime}.edgepkg"
            packaged = edgesdk(
                "package", str(subset), "--name", "digits", "--version", f"1.{release}.0", "--release", str(release),
                "--publisher-key", str(publisher_key), "--recipients-from-registry", str(lane_root / "enrollment.json"),
                "--out", str(bundle), "--json",
            )  # fmt: skip
            assert packaged.returncode == 0, packaged.stderr
            assert json.loads(packaged.stdout)["recipients"] == [key_id(device_public)]
            pushed = edgesdk(
                "fleet", "push", str(bundle), "--broker", mqtt_broker.url, "--devices", DEVICE_ID,
                "--canary", "100%", "--waves", "100%", "--probation", "1s", "--wave-timeout", "600s",
                "--chunk-size", "32768", "--operator-key", str(publisher_key),
                "--db", str(lane_root / "fleet.sqlite3"), "--json",
            )  # fmt: skip
            assert pushed.returncode == 0, pushed.stdout + pushed.stderr + agent.log()[-4000:]
            model = http_json(f"{url}/v1/status")["model"]
            assert model["release"] == release and model["runtime"] == runtime, model
            # One image per request: the LiteRT variants have a fixed batch of 1.
            device_logits = np.concatenate(
                [
                    np.asarray(
                        http_json(f"{url}/v1/models/digits/infer", {"inputs": {"image": images[i : i + 1].tolist()}})[
                            "outputs"
                        ]["logits"],
                        dtype=np.float32,
                    )
                    for i in range(len(images))
                ]
            )
            host_logits = host_outputs(subset, model["variant"], images)
            np.testing.assert_allclose(device_logits, host_logits, atol=ATOL[runtime], err_msg=f"{runtime} on arm64")
            assert (device_logits.argmax(1) == host_logits.argmax(1)).all(), runtime
            served[runtime] = f"{model['variant']} (max |diff| {np.abs(device_logits - host_logits).max():.2g})"
            # Where it runs: the profile's provider, device or delegate, which this board's CPU has.
            (choice,) = [c for c in http_json(f"{url}/v1/status")["variants"] if c["id"] == model["variant"]]
            wanted = next(r for r in get_profile(device_side.profile).runtimes if r.runtime.value == runtime)
            assert choice["execution"]["using"][0] == wanted.execution_providers[0], choice
            assert choice["execution"]["fallback"] is None, choice
        print(f"served on the device side, equal to this machine's within {ATOL}: {served}")
        log = agent.log()
        # Opened in the unseal helper (the default): the daemon itself never decrypted.
        assert "unseal" in log.lower() or status.get("unseal", "helper") == "helper"

        # Telemetry names the model serving now, with latency per variant and the process's RSS.
        def last_telemetry() -> Telemetry | None:
            reports = [Telemetry.model_validate(t) for t in observer.json("telemetry")]
            latest = [t for t in reports if t.model is not None and t.model.release == len(runtimes)]
            return latest[-1] if latest and latest[-1].latency else None

        report = wait_for(last_telemetry, 60, "telemetry naming the last model", agent)
        assert report.device_id == DEVICE_ID and report.rss_mb and report.rss_mb > 0
        assert model["variant"] in report.latency
    finally:
        observer.stop()
        code = agent.stop()
    assert code == 0, agent.log()[-4000:]


def _install_on_device(side: DeviceSide, device: Device, bundle: Path) -> None:
    """``edge-agent install`` on the device side (a side-load, as install.sh does for its bundle)."""
    proc = side.run(
        side.venv_python, "-m", "edgesdk.agent.cli", "install", "--config", str(device.config), str(bundle),
        env={"HOME": str(device.root / "home")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def onnx_fp32_int8(digits, tmp_path_factory) -> Path:
    """onnx-fp32 and onnx-int8 (static QDQ) of the digits CNN: two precisions to switch between."""
    return make_digits_convert_dir(digits, tmp_path_factory.mktemp("convert") / "onnx", profile="rpi5-8gb")


def test_precision_follows_a_scripted_heat_trace(
    device_side: DeviceSide, installed_image, lane_root: Path, onnx_fp32_int8: Path, images: np.ndarray
) -> None:
    from edgesdk.agent.security_state import create_with_new_key

    from edgesdk.keys import generate_device_key, generate_publisher_key

    publisher_key, publisher_pub = generate_publisher_key(lane_root / "publisher")
    trace = lane_root / "trace.jsonl"
    # rpi5-8gb steps down at 76 °C and up at 67 °C: cool, hot from 15 s, cool again from 60 s
    # (from the governor's first reading, which comes before the API listens).
    readings = [(0, 55.0), (15, 79.0), (60, 55.0)]
    trace.write_text("\n".join(json.dumps({"at_s": at, "temperatures_c": {"soc": c}}) for at, c in readings) + "\n")
    device = lane_device(lane_root / "device", publisher_key, publisher_pub, profile=device_side.profile)
    key, _ = generate_device_key(device.data_dir)
    create_with_new_key(device.data_dir, key)  # a key without its security state record is tampered with
    reconfigure(
        device,
        governor={"enabled": True, "source": "trace", "trace_file": str(trace), "poll_interval_s": 0.2,
                  "min_dwell_s": 1.0},
    )  # fmt: skip
    _install_on_device(device_side, device, device.bundle(onnx_fp32_int8, version="1.0.0", release=1))
    with agent_on_device(device_side, device) as agent:

        def variant() -> str:
            answer = http_json(f"{agent.url}/v1/models/digits/infer", {"inputs": {"image": images[:1].tolist()}})
            return str(http_json(f"{agent.url}/v1/status")["model"]["variant"]) if answer["outputs"] else ""

        seen = [variant()]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (len(seen) >= 3 and seen[-1] == "onnx-fp32" and "onnx-int8" in seen):
            current = variant()
            if current != seen[-1]:
                seen.append(current)
            time.sleep(0.5)
        status = http_json(f"{agent.url}/v1/status")
    # The trace may start hot or cool by the time the agent listens; what must hold is the order.
    assert "onnx-int8" in seen and seen[-1] == "onnx-fp32", (seen, agent.log()[-3000:])
    switches = [e for e in status["recent_events"] if e["event"] == "precision_switch"]
    assert switches and all(e["reason"].startswith("temperature") for e in switches), switches
    assert "precision switch onnx-fp32 -> onnx-int8 (temperature 79.0" in agent.log()


def test_profile_times_every_variant_on_the_device_and_orders_the_ladder(
    device_side: DeviceSide, installed_image, lane_root: Path, onnx_fp32_int8: Path
) -> None:
    """``edge-agent profile`` on the device side: each variant timed there (which is faster under
    emulation means nothing; that the served ladder follows what was measured does)."""
    from edgesdk.agent.security_state import create_with_new_key

    from edgesdk.keys import generate_device_key, generate_publisher_key
    from edgesdk.profiles import get_profile

    publisher_key, publisher_pub = generate_publisher_key(lane_root / "publisher")
    device = lane_device(lane_root / "device", publisher_key, publisher_pub, profile=device_side.profile)
    key, _ = generate_device_key(device.data_dir)
    create_with_new_key(device.data_dir, key)  # a key without its security state record is tampered with
    cool = lane_root / "cool.jsonl"
    cool.write_text(json.dumps({"at_s": 0, "temperatures_c": {"soc": 50.0}}) + "\n")
    reconfigure(device, governor={"enabled": True, "source": "trace", "trace_file": str(cool)})
    _install_on_device(device_side, device, device.bundle(onnx_fp32_int8, version="1.0.0", release=1))
    proc = device_side.run(
        device_side.venv_python, "-m", "edgesdk.agent.cli", "profile", "--config", str(device.config),
        "--warmup", "2", "--runs", "10", "--json", *(("--emulated",) if device_side.mode == "chroot" else ()),
        env={"HOME": str(device.root / "home")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(proc.stdout)
    print(f"profile on the device side: {json.dumps(figures['variants'])}")
    print(f"runtime footprints on the device side: {json.dumps(figures['runtimes'])}")
    assert figures["machine"] == ("aarch64" if device_side.mode == "chroot" else figures["machine"])
    assert figures["emulated"] is (device_side.mode == "chroot")
    assert {v["variant"] for v in figures["variants"]} == {"onnx-fp32", "onnx-int8"}
    # Every runtime of the profile, imported before the first variant (so no variant carries a
    # library), with the disk its aarch64 wheel takes there.
    footprints = {r["runtime"]: r for r in figures["runtimes"]}
    assert set(footprints) == {r.runtime.value for r in get_profile(device_side.profile).runtimes}
    assert all(r["rss_mb"] > 0 and r["import_ms"] > 0 and r["installed_mb"] > 1 for r in footprints.values())
    _footprints_reach_the_planner(lane_root, device_side.profile, proc.stdout, footprints)
    assert all(v["p50_ms"] > 0 and v["runs"] == 10 and v["load_ms"] > 0 for v in figures["variants"])
    assert figures["speed_ladder"][0] == "onnx-fp32"
    assert set(figures["speed_ladder"]) | set(figures["not_steps"]) == {"onnx-fp32", "onnx-int8"}
    with agent_on_device(device_side, device) as agent:
        status = http_json(f"{agent.url}/v1/status")
    assert status["measured"]["speed_ladder"] == figures["speed_ladder"]
    assert status["governor"]["ladder"] == figures["speed_ladder"]  # the governor steps through what was measured


def _footprints_reach_the_planner(lane_root: Path, profile_name: str, document: str, footprints: dict) -> None:
    """The operator's side: the figures into the profile's measured: section, and the planner
    counting them (this board has room for all three runtimes: each is planned, with its figures)."""
    from edgesdk.converters.planner import make_plan

    from edgesdk.profiles import get_profile
    from edgesdk.schemas.common import RuntimeName

    (lane_root / "measurements.json").write_text(document)
    out = lane_root / "profiles"
    imported = edgesdk("profiles", "import-measurements", str(lane_root / "measurements.json"), "--out", str(out))
    assert imported.returncode == 0, imported.stdout + imported.stderr
    profile = get_profile(profile_name, [out])
    assert len(profile.measured) == 1 and profile.measured[0].machine == "aarch64"
    plan = make_plan(profile, "onnx", has_calibration=True, host_runtimes=tuple(RuntimeName))
    for runtime, figures in footprints.items():
        line = f"runtime {runtime} on {profile_name}: {figures['installed_mb']:.0f} MB installed"
        assert any(d.startswith(line) for d in plan.decisions), plan.decisions
    assert not any("does not fit" in r.reason for r in plan.rejected), plan.rejected


def test_sigkill_mid_update_then_the_new_model_serves(
    device_side: DeviceSide, installed_image, lane_root: Path, mqtt_broker, onnx_fp32_int8: Path
) -> None:
    """Killed (SIGKILL, like a power cut) right after the STAGED state is persisted; started
    again as plain ``edge-agent run``, it resumes and commits, and reports what it serves."""
    from edgesdk.agent.security_state import create_with_new_key

    from edgesdk.keys import generate_device_key, generate_publisher_key

    require_mosquitto()
    publisher_key, publisher_pub = generate_publisher_key(lane_root / "publisher")
    device = lane_device(
        lane_root / "device", publisher_key, publisher_pub, profile=device_side.profile,
        mqtt={"enabled": True, "broker": mqtt_broker.url, "telemetry_interval_s": 3600},
    )  # fmt: skip
    key, _ = generate_device_key(device.data_dir)
    create_with_new_key(device.data_dir, key)  # a key without its security state record is tampered with
    reconfigure(device, device_key=str(device.data_dir / "device.key"))
    _install_on_device(device_side, device, device.bundle(onnx_fp32_int8, version="1.0.0", release=1))
    v2 = device.bundle(onnx_fp32_int8, version="2.0.0", release=2)
    operator = Operator(lane_root, publisher_key, mqtt_broker.url)
    first = agent_on_device(device_side, device, module="tests.faulty_agent", args=("--kill-at", "STAGED")).start()
    second: AgentProcess | None = None
    try:
        assert http_json(f"{first.url}/v1/status")["model"]["release"] == 1
        deployment_id = operator.push(v2, DEVICE_ID)
        assert first.proc is not None
        first.proc.wait(600)
        # chroot passes the signal's exit on as 128 + 9; the board's process is killed directly.
        assert first.proc.returncode in (-9, 137), first.log()[-3000:]
        assert "killing the agent right after STAGED was persisted" in first.log()
        assert json.loads((device.model_dir() / "ota" / "state.json").read_text())["state"] == "STAGED"
        second = agent_on_device(device_side, device).start()
        assert http_json(f"{second.url}/v1/status")["model"]["release"] in (1, 2)  # serving at once
        assert operator.thread is not None
        operator.thread.join(600)
        row = operator.device_row(deployment_id)
        assert row.state == "COMMITTED", (row, second.log()[-3000:])
        status = http_json(f"{second.url}/v1/status")
        assert status["model"]["release"] == 2 == row.model_release and status["updates"]["state"] == "COMMITTED"
    finally:
        operator.close()
        first.stop()
        if second is not None:
            second.stop()


#: The unit tests of what runs on a device (agent, bundle verification and crypto, OTA, MQTT
#: client, trust, schemas and profiles). Not: converters, the CLI and demo, image building, and
#: tests that read the source tree (layering, fault seams, firmware files), which is not on a
#: device. Under emulation the whole tier takes ~9 min here; these ~5.
DEVICE_SIDE_UNIT_TESTS = (
    "test_agent_*.py", "test_bundle_verify.py", "test_bundle_crypto.py", "test_bundle_start_path.py",
    "test_bundle_bytes_buffer.py", "test_broker_credentials.py", "test_chunk_rate_limit.py", "test_keys.py",
    "test_mqtt_client.py", "test_mqtt_queue.py", "test_mqtt_paho_private_api.py", "test_ota_download_pace.py",
    "test_ota_freshness.py", "test_ota_probation.py", "test_ota_state_machine.py", "test_ota_transfer.py",
    "test_systemd_notify.py", "test_trust.py", "test_schemas.py", "test_profiles.py",
)  # fmt: skip


def test_an_update_downloaded_over_http_commits(
    device_side: DeviceSide, installed_image, lane_root: Path, mqtt_broker, onnx_fp32_int8: Path
) -> None:
    """The deployment's HTTP path: the agent in the chroot downloads the bundle from a URL on
    this machine (loopback), checks it against the signed hash, and commits."""
    import functools
    import http.server

    from edgesdk.agent.security_state import create_with_new_key

    from edgesdk.keys import generate_device_key, generate_publisher_key

    require_mosquitto()
    publisher_key, publisher_pub = generate_publisher_key(lane_root / "publisher")
    device = lane_device(
        lane_root / "device", publisher_key, publisher_pub, profile=device_side.profile,
        mqtt={"enabled": True, "broker": mqtt_broker.url, "telemetry_interval_s": 3600},
    )  # fmt: skip
    key, _ = generate_device_key(device.data_dir)
    create_with_new_key(device.data_dir, key)  # a key without its security state record is tampered with
    reconfigure(device, device_key=str(device.data_dir / "device.key"))
    _install_on_device(device_side, device, device.bundle(onnx_fp32_int8, version="1.0.0", release=1))
    v2 = device.bundle(onnx_fp32_int8, version="2.0.0", release=2)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(v2.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    operator = Operator(lane_root, publisher_key, mqtt_broker.url)
    try:
        with agent_on_device(device_side, device) as agent:
            url = f"http://127.0.0.1:{server.server_address[1]}/{v2.name}"
            deployment_id = operator.push(v2, DEVICE_ID, url=url)
            assert operator.thread is not None
            operator.thread.join(600)
            row = operator.device_row(deployment_id)
            assert row.state == "COMMITTED", (row, agent.log()[-3000:])
            assert http_json(f"{agent.url}/v1/status")["model"]["release"] == 2
    finally:
        operator.close()
        server.shutdown()


def test_device_side_unit_tests_pass_on_the_device_side(device_side: DeviceSide, installed_image) -> None:
    """The device side's unit tests with the agent's install only (plus pytest): what needs a
    converter or another extra skips and says so."""
    import os

    wheels = os.environ.get("EDGESDK_ARM64_TEST_WHEELS")
    if not wheels:
        pytest.skip("no pytest wheels for the device side (scripts/test-arm64 downloads them)")
    lane_wheels = device_side.host_path(LANE_DIR) / "wheels"
    shutil.copytree(wheels, lane_wheels, dirs_exist_ok=True)
    pip = device_side.run(
        device_side.venv_python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
        f"{LANE_DIR}/wheels", "pytest", "pytest-timeout", offline=True,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    unit_dir = Path(__file__).resolve().parents[1] / "unit"
    files = sorted({f"tests/unit/{p.name}" for pattern in DEVICE_SIDE_UNIT_TESTS for p in unit_dir.glob(pattern)})
    assert len(files) > 20, files
    unit = device_side.run(
        "/bin/sh", "-c",
        f"cd {LANE_DIR} && exec {device_side.venv_python} -m pytest -q -p no:cacheprovider {' '.join(files)}",
        offline=True, timeout=1800,
    )  # fmt: skip
    summary = unit.stdout.strip().splitlines()[-1:] if unit.stdout.strip() else ["(no output)"]
    print(f"device-side unit tests ({len(files)} files) on the device side: {summary[0]}")
    assert unit.returncode == 0, unit.stdout[-6000:] + unit.stderr[-2000:]
    assert " passed" in summary[0] and "failed" not in summary[0]
