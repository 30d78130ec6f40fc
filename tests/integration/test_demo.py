"""The README's first command, ``scripts/demo``, end to end from a clean copy of the tracked
tree (real converter, a real broker: the embedded amqtt one and mosquitto, edge-agent and fleet
service processes); ``edgesdk demo``'s Ctrl-C cleanup, a failing step, and its bad input. The
trained digits model comes from the session cache (``--model-cache``) so the suite does not
train it twice; everything else runs for real."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error
from tests.integration.conftest import require_mosquitto

pytestmark = pytest.mark.slow


def processes_mentioning(text: str) -> dict[int, str]:
    """pid → command line of every process whose command line contains ``text``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found[int(entry.name)] = cmdline
    return found


def wait_gone(text: str, timeout: float = 60.0) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    left = processes_mentioning(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_mentioning(text)
    return left


def demo_argv(workdir: Path, reports: Path, digits, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "edgesdk.cli.main", "demo", "--workdir", str(workdir), "--reports", str(reports),
        "--model-cache", str(digits.directory), *extra,
    ]  # fmt: skip


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files of this checkout, as a fresh clone has them (git's file modes), in a
    new directory: untracked files, build outputs and the repository's own .venv stay behind.

    Shared with the checkout, on purpose: the virtualenv (``EDGESDK_VENV``, the one running this
    test), and with it the edgesdk package (installed editable from the checkout), so the copy
    tests the README's commands and scripts, not a second install. The copy keeps the files'
    times, so ``scripts/bootstrap`` sees a pyproject.toml older than the venv's install stamp and
    installs nothing; the test checks that first, because a bootstrap that did install would
    point the shared venv at the copy."""
    venv = Path(sys.prefix)
    stamp = venv / ".edgesdk-installed"
    if not stamp.is_file() or stamp.stat().st_mtime < (REPO / "pyproject.toml").stat().st_mtime:
        pytest.skip(f"{venv} is not bootstrapped for this pyproject.toml: run scripts/bootstrap first")
    if not list((venv / "wheels").glob("pymicro_wakeword-*.whl")) or not list((venv / "wheels").glob("basic_pitch-*")):
        pytest.skip(f"{venv}/wheels lacks the prebuilt model wheels: run scripts/bootstrap first")
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-s", "-z"], capture_output=True, text=True, check=True
    ).stdout
    copy = tmp_path_factory.mktemp("clean-tree")
    for entry in filter(None, listed.split("\0")):
        mode, _sha, _stage_and_path = entry.split(" ", 2)
        path = _stage_and_path.split("\t", 1)[1]
        source, target = REPO / path, copy / path
        if mode == "160000" or not source.is_file():  # a submodule, or deleted in the checkout
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)  # with its mtime
        target.chmod(0o755 if mode == "100755" else 0o644)
    return copy


def run_scripts_demo(
    tree: Path, tmp_path: Path, digits, *extra: str, wrap: list[str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``scripts/demo`` (the README's first command) from ``tree``, with ``--json``; returns the
    process and its wall time. ``wrap`` runs it under another command (see ``without_mosquitto``)."""
    workdir, reports = tmp_path / "work", tmp_path / "reports"
    env = {**os.environ, "EDGESDK_VENV": sys.prefix}
    argv = [str(tree / "scripts" / "demo"), "--workdir", str(workdir), "--reports", str(reports)]
    argv += ["--model-cache", str(digits.directory), "--json", *extra]
    began = time.monotonic()
    proc = subprocess.run([*(wrap or []), *argv], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    wall = time.monotonic() - began
    print(f"scripts/demo {' '.join(extra)} wall time: {wall:.0f} s")
    assert "==> installing" not in proc.stdout + proc.stderr  # the shared venv was left alone
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, wall


def without_mosquitto(tmp_path: Path) -> list[str]:
    """A command prefix under which no mosquitto binary can be found, as on a fresh machine: a
    private mount namespace where every mosquitto the finder would see (on PATH and in its fixed
    places) is covered by an empty, non-executable file. Needs root and util-linux's unshare
    (CI runs as root); elsewhere the test skips with the reason."""
    from edgesdk.mqtt.broker import _SEARCH_PATH

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("hiding mosquitto needs root and unshare (a private mount namespace)")
    found = {p for p in (shutil.which("mosquitto"), *_SEARCH_PATH) if p and os.access(p, os.X_OK)}
    blank = tmp_path / "no-mosquitto"
    blank.write_bytes(b"")
    blank.chmod(0o644)
    mounts = " && ".join(f"mount --bind {shlex.quote(str(blank))} {shlex.quote(p)}" for p in sorted(found)) or "true"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh"]


def summary_of(stdout: str) -> dict:
    """The JSON summary: with ``--json`` stdout holds it alone (scripts/demo's profile table goes
    to stderr), so a script can pipe it."""
    return json.loads(stdout)


def test_readme_first_command_without_mosquitto_runs_the_whole_story(clean_tree: Path, tmp_path: Path, digits) -> None:
    """A machine without mosquitto (hidden in a private mount namespace): the default broker
    choice finds none and takes the embedded amqtt broker (MQTT 3.1.1), which the fleet service
    and agents must work with."""
    pytest.importorskip("amqtt", reason="the embedded broker is the 'demo' extra (pip install 'edgesdk[demo]')")
    workdir, reports = tmp_path / "work", tmp_path / "reports"
    proc, _wall = run_scripts_demo(clean_tree, tmp_path, digits, wrap=without_mosquitto(tmp_path))
    summary = summary_of(proc.stdout)
    assert "✓ rollout v3" in proc.stderr  # progress went to stderr, the JSON alone to stdout
    assert "embedded amqtt broker (MQTT 3.1.1)" in proc.stderr

    # Conversion: a real precision ladder for the profile.
    precisions = [v["precision"] for v in summary["conversion"]["variants"]]
    assert "fp32" in precisions and len(precisions) >= 2

    rollouts = {r["name"]: r for r in summary["rollouts"]}
    assert [(r["name"], r["state"]) for r in summary["rollouts"]] == [
        ("v1", "SUCCEEDED"), ("wakeword", "SUCCEEDED"), ("v2", "SUCCEEDED"), ("v3", "ABORTED"),
    ]  # fmt: skip
    devices = sorted(d["device_id"] for d in summary["devices"])
    assert len(devices) == 3
    assert {d["state"] for d in rollouts["v1"]["devices"]} == {"COMMITTED"}
    # v2: a canary of one device first, then the rest; all committed.
    assert len(rollouts["v2"]["waves"][0]) == 1 and len(rollouts["v2"]["waves"]) == 2
    assert {d["state"] for d in rollouts["v2"]["devices"]} == {"COMMITTED"}
    # v3: the canary broke the latency SLO in probation and rolled back; nobody else got it.
    by_state = {d["device_id"]: d["state"] for d in rollouts["v3"]["devices"]}
    (canary,) = rollouts["v3"]["waves"][0]
    assert by_state.pop(canary) == "ROLLED_BACK"
    assert set(by_state.values()) == {"PENDING"}
    assert "p95 latency" in rollouts["v3"]["reason"]

    # The rollouts were the fleet service's: created over its REST API with the demo's token
    # (audited), driven and ended by the service (its database and its log), not by the CLI.
    service = summary["service"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", service["dashboard"]), service
    assert service["dashboard"] in proc.stderr  # announced while the demo runs
    assert Path(service["token_file"]).stat().st_mode & 0o077 == 0
    database = sqlite3.connect(service["database"].removeprefix("sqlite:///"))
    try:
        states = dict(database.execute("SELECT id, state FROM deployments").fetchall())
        audited = database.execute("SELECT actor, action, outcome FROM audit_log").fetchall()
    finally:
        database.close()
    assert states == {r["deployment_id"]: r["state"] for r in summary["rollouts"]}
    created = [(actor, outcome) for actor, action, outcome in audited if action == "deployment.create"]
    assert len(created) == 4 and all(a.startswith("edgesdk-demo") and o == "ok" for a, o in created), audited
    service_log = Path(service["log"]).read_text()
    assert f"deployment {rollouts['v3']['deployment_id']}: ABORTED" in service_log

    # The digits traffic is real files: PNGs answered with labels by the bundle's pipeline,
    # through v1, v2 and v3's rollback (which once lost the pipeline: 404s after it).
    assert summary["digits_traffic"] == "PNG files to /predict"
    for device in summary["devices"]:
        assert device["release"] == 2 and device["version"] == "1.1.0", device
        assert device["requests"] > 50 and device["failed_requests"] == 0, device
        assert device["accuracy"] >= 0.95, device

    # A second real model (the wake-word .tflite, as-is, LiteRT) installed over the air beside
    # digits on every device; its traffic ran through the v2 and v3 rollouts of digits (v3's
    # rollback included) without one failed request.
    assert summary["second_model"] == {
        "name": "okay_nabu",
        "variant": "tflite-int8",
        "size": summary["second_model"]["size"],
    }
    assert {d["state"] for d in rollouts["wakeword"]["devices"]} == {"COMMITTED"}
    for device in summary["devices"]:
        assert device["second_model_requests"] > 50 and device["second_model_failed_requests"] == 0, device

    # The heat wave: the hot device stepped down the ladder and came back; the others never moved.
    heat = summary["heat"]
    assert heat["back_up_at_s"] > heat["stepped_down_at_s"]
    hot = next(d for d in summary["devices"] if d["device_id"] == heat["device"])
    assert len(hot["precisions_used"]) >= 2
    assert all(d["precisions_used"] == ["fp32"] for d in summary["devices"] if d is not hot)

    # Reports: the conversion report and a fleet report with embedded PNG plots.
    assert Path(summary["reports"]["conversion"]).is_file()
    page = Path(summary["reports"]["fleet"]).read_text()
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(images) == 2
    assert all(base64.b64decode(image)[:8] == b"\x89PNG\r\n\x1a\n" for image in images)
    assert json.loads((reports / "summary.json").read_text()) == summary
    samples = json.loads((workdir / "samples.json").read_text())
    assert set(samples) == set(devices) and all(len(s) > 20 for s in samples.values())

    assert wait_gone(str(workdir)) == {}  # no agent, no broker left behind


def test_readme_first_command_with_mosquitto(clean_tree: Path, tmp_path: Path, digits) -> None:
    """The same command where mosquitto is installed (the broker ``auto`` picks then); the story's
    details are checked on the embedded broker above, here that it runs to the end."""
    require_mosquitto()
    workdir = tmp_path / "work"
    proc, _wall = run_scripts_demo(clean_tree, tmp_path, digits, "--agents", "2")
    summary = summary_of(proc.stdout)
    assert "broker" in proc.stderr and "mosquitto on mqtt://127.0.0.1:" in proc.stderr
    assert [(r["name"], r["state"]) for r in summary["rollouts"]] == [
        ("v1", "SUCCEEDED"), ("wakeword", "SUCCEEDED"), ("v2", "SUCCEEDED"), ("v3", "ABORTED"),
    ]  # fmt: skip
    assert sorted(d["device_id"] for d in summary["devices"]) == ["edge-1", "edge-2"]
    assert all(d["release"] == 2 and d["failed_requests"] == 0 for d in summary["devices"]), summary["devices"]
    assert summary["heat"]["back_up_at_s"] > summary["heat"]["stepped_down_at_s"]
    assert wait_gone(str(workdir)) == {}


def test_a_failing_fleet_service_is_named_with_the_end_of_its_log(tmp_path: Path) -> None:
    """A real ``edgesdk fleet serve`` started by the demo's step, on a broker address where
    nothing listens: the step's error carries the service's log, whose last lines the CLI shows."""
    pytest.importorskip("sqlalchemy", reason="the fleet service is the 'fleet-service' extra")
    from edgesdk.cli.demo_cmd import failure_report
    from edgesdk.demo.story import Demo, DemoError, DemoOptions, _free_port
    from edgesdk.profiles import get_profile

    options = DemoOptions(profile=get_profile("rpi5-8gb"), workdir=tmp_path, reports_dir=tmp_path / "reports")
    demo = Demo(options, say=lambda _message: None)
    try:
        keys = demo.make_keys()
        demo.broker_url = f"mqtt://127.0.0.1:{_free_port()}"  # nothing listens there
        started = demo.start_service(keys)
        with pytest.raises(DemoError) as failed:
            demo.wait_service(started)
    finally:
        demo.cleanup()
    log = tmp_path / "fleet" / "service.log"
    assert failed.value.log_file == log
    assert str(failed.value) == f"the fleet service exited with status 1; see {log}"
    report = failure_report(failed.value, tmp_path).splitlines()
    assert report[0] == f"error: {failed.value}"
    assert any(f"error: cannot connect to broker {demo.broker_url}" in line for line in report[2:-1]), report
    assert report[-1] == f"work dir kept: {tmp_path}"


def _sigint_as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_every_process_it_started(tmp_path: Path, digits) -> None:
    require_mosquitto()
    workdir, reports = tmp_path / "work", tmp_path / "reports"
    demo = subprocess.Popen(
        demo_argv(workdir, reports, digits),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a shell's background job (`(cmd &)`, how CI may be started) inherits
        # SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all.
        preexec_fn=_sigint_as_from_a_terminal,
    )
    try:
        deadline = time.monotonic() + 600
        port_files: list[Path] = []
        while len(port_files) < 3 and time.monotonic() < deadline and demo.poll() is None:
            port_files = list((workdir / "devices").glob("*/data/api.port")) if (workdir / "devices").exists() else []
            time.sleep(0.2)
        assert len(port_files) == 3, demo.stderr.read() if demo.poll() is not None else "agents did not start"
        running = processes_mentioning(str(workdir))
        # Positive control: the scan sees the three agents and the broker while the demo runs.
        assert sum("edge-agent" in c or "edgesdk.agent.cli" in c for c in running.values()) == 3, running
        assert any("mosquitto" in c for c in running.values()), running
        assert any("fleet serve" in c for c in running.values()), running
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, err[-3000:]
    assert "interrupted" in err and "Traceback" not in err
    assert wait_gone(str(workdir)) == {}


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--profile", "rpi9"], ["rpi9"]),
        (["--agents", "1"], ["--agents", "1"]),
    ],
)
def test_bad_input_is_one_line(edgesdk_cli, args: list[str], needles: list[str]) -> None:
    assert_one_line_error(edgesdk_cli("demo", *args), *needles)


def test_workdir_must_be_new_or_empty(tmp_path: Path, edgesdk_cli) -> None:
    (tmp_path / "something").write_text("mine")
    assert_one_line_error(edgesdk_cli("demo", "--workdir", str(tmp_path)), str(tmp_path), "not empty")
    assert (tmp_path / "something").read_text() == "mine"


def test_embedded_broker_carries_retained_qos1_messages_for_mqtt_311_clients(tmp_path: Path) -> None:
    """The fallback when mosquitto is missing (``--broker embedded``): a separate process that
    our MQTT client reaches with protocol 3.1.1, with retained and QoS 1 messages."""
    pytest.importorskip("amqtt", reason="the embedded broker is the 'demo' extra (pip install 'edgesdk[demo]')")
    pytest.importorskip("paho.mqtt")
    from edgesdk.demo.processes import ProcessSet
    from edgesdk.demo.story import _free_port, _port_open
    from edgesdk.mqtt.client import ClientOptions, MqttClient

    port = _free_port()
    processes = ProcessSet()
    processes.start(
        "broker", [sys.executable, "-m", "edgesdk.demo.embedded_broker", "--port", str(port)], log_file=tmp_path / "log"
    )
    clients: list[MqttClient] = []
    try:
        deadline = time.monotonic() + 60
        while not _port_open(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        url = f"mqtt://127.0.0.1:{port}"
        publisher = MqttClient(ClientOptions(client_id="pub", broker_url=url, protocol="3.1.1"))
        clients.append(publisher)
        publisher.start()
        assert publisher.wait_connected(60), publisher.stats.last_error
        publisher.publish("edgesdk/devices/d1/presence", b"online", qos=1, retain=True)
        received: list[tuple[str, bytes]] = []
        subscriber = MqttClient(ClientOptions(client_id="sub", broker_url=url, protocol="3.1.1"))
        clients.append(subscriber)
        subscriber.on_message = lambda topic, payload: received.append((topic, payload))
        subscriber.subscribe("edgesdk/devices/+/presence", qos=1)
        subscriber.start()
        assert subscriber.wait_connected(60)
        deadline = time.monotonic() + 60
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ("edgesdk/devices/d1/presence", b"online") in received  # retained, delivered late
    finally:
        for client in clients:
            client.stop()
        processes.stop_all()
    assert not _port_open(port)
