"""Secrets stay secret, tried on real agent processes: the device's private key is nowhere in the
serving daemon's memory after it announced itself over MQTT (real mosquitto) and took an OTA
update; a crash writes no core file. Each check has a positive control that shows it can fail."""

from __future__ import annotations

import base64
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgesdk.schemas.messages import HealthCriteria
from tests.agent_helpers import AgentProcess, make_device, run_agent_cli
from tests.mqtt_helpers import Collector
from tests.ota_helpers import OtaBundles, build_ota_bundles

pytestmark = pytest.mark.slow

if not Path("/proc/self/maps").exists():
    pytest.skip("needs /proc/<pid>/maps and /proc/<pid>/mem (Linux)", allow_module_level=True)


@pytest.fixture(scope="module")
def bundles(digits, tmp_path_factory) -> OtaBundles:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paho.mqtt")
    return build_ota_bundles(digits, tmp_path_factory.mktemp("secrets-bundles"))


def secret_needles(device_key: Path) -> dict[str, bytes]:
    """What of the private key could sit in memory: its 32 raw bytes and its PEM's base64 body."""
    from edgesdk.keys import load_device_private_key

    raw = load_device_private_key(device_key).private_bytes_raw()
    pem_body = "".join(line for line in device_key.read_text().splitlines() if not line.startswith("-----"))
    return {"raw key": raw, "PEM body": pem_body.encode(), "raw key, base64": base64.b64encode(raw)}


def readable_memory_holds(pid: int, needles: dict[str, bytes]) -> list[str]:
    """Scan every readable mapping of ``pid`` through /proc/PID/mem; the needles found (and where)."""
    found: list[str] = []
    overlap = max(len(n) for n in needles.values()) - 1
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if not fields[1].startswith("r") or (len(fields) > 5 and fields[5] == "[vvar]"):
                continue
            tail = b""
            position = start
            while position < end:
                size = min(16 << 20, end - position)
                try:
                    mem.seek(position)
                    block = mem.read(size)
                except OSError:
                    break  # a guard page or a mapping that went away meanwhile
                window = tail + block
                for name, needle in needles.items():
                    if needle in window:
                        found.append(f"{name} in {fields[0]} {fields[5] if len(fields) > 5 else '[anon]'}")
                tail = window[-overlap:]
                position += size
    return sorted(set(found))


def ota_device(root: Path, bundles: OtaBundles, broker_url: str, unseal: str):
    from tests.integration.test_ota_agent_process import make_device as make_ota_device

    device = make_ota_device(root, bundles, broker_url)  # release 1 installed (edge-agent install)
    device.write_config(**{**device.settings, "unseal": unseal})
    return device


@pytest.mark.parametrize("unseal", ["helper", "in_process"])
def test_device_key_is_not_in_the_daemon_after_presence_enrollment_and_an_ota_update(
    tmp_path: Path, bundles: OtaBundles, mqtt_broker, unseal: str
) -> None:
    """Attack: read the serving daemon's memory (a memory disclosure bug, a core file, a
    debugger) for the device's private key. With the helper (the default) it is not there
    after the link announced the device and an OTA update verified, decrypted and committed a
    new bundle; ``in_process`` (the opt-out) is the positive control: the same scan finds it."""
    from edgesdk.agent.keyring import read_device_public_key

    from tests.integration.test_ota_agent_process import Operator, api_get, infer

    device = ota_device(tmp_path / "device", bundles, mqtt_broker.url, unseal)
    needles = secret_needles(bundles.keys.device_key)
    announced = Collector(mqtt_broker.url, "edgesdk/devices/dev-1/#", client_id=f"watch-{unseal}")
    operator = Operator(tmp_path, bundles, mqtt_broker.url)
    try:
        with AgentProcess(device) as agent:
            pid = agent.proc.pid
            # Presence and enrollment carry the public key, read from device.pub.
            public = base64.b64encode(read_device_public_key(bundles.keys.device_pub)).decode()
            assert announced.wait_for(lambda: bool(announced.json("enroll")) and bool(announced.json("presence")))
            assert {e["public_key"] for e in announced.json("enroll")} == {public}
            assert any(p.get("public_key") == public for p in announced.json("presence"))
            mapped_before_update = "cryptography" in Path(f"/proc/{pid}/maps").read_text()

            deployment_id = operator.push(bundles.v2, HealthCriteria(probation_s=1))
            operator.thread.join(240)
            row = operator.device_row(deployment_id)
            assert row.state == "COMMITTED", (row, agent.log()[-3000:])
            assert api_get(agent, "/v1/status")["model"]["release"] == 2
            assert len(infer(agent)) == 1
            found = readable_memory_holds(pid, needles)
            children = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == pid]
    finally:
        operator.close()
        announced.stop()
    if unseal == "helper":
        assert found == [], found
        assert not mapped_before_update  # presence and enrollment needed no crypto library either
        assert children == []  # every helper of the update has exited
    else:
        assert found, "the in-process agent holds the key, yet the scan did not find it: the scan is blind"


def _parent(proc_dir: Path) -> int | None:
    try:
        stat = (proc_dir / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_sideload_into_a_running_daemon_keeps_key_and_crypto_out_of_it(tmp_path: Path, bundles: OtaBundles) -> None:
    """``edge-agent install`` beside a running daemon, then SIGHUP: the daemon loads the new
    bundle through the helper; neither the key nor cryptography's native library enter it."""
    from edgesdk.agent.security_state import create_with_new_key

    from tests.agent_helpers import Device

    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    keys = bundles.keys
    device = Device(tmp_path, data_dir, keys.publisher_key, keys.publisher_pub, keys.device_pub, tmp_path / "a.toml")
    device.write_config(device_key=str(keys.device_key), governor={"enabled": False, "source": "psutil"})
    create_with_new_key(data_dir, keys.device_key)  # the shared test key's record in this data dir
    assert run_agent_cli("install", "--config", str(device.config), str(bundles.v1)).returncode == 0
    with AgentProcess(device) as agent:
        proc = run_agent_cli("install", "--config", str(device.config), str(bundles.v2))
        assert proc.returncode == 0, proc.stderr
        assert "loading it" in proc.stdout
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _release(agent) != 2:
            time.sleep(0.2)
        assert _release(agent) == 2, agent.log()[-3000:]
        assert "cryptography" not in Path(f"/proc/{agent.proc.pid}/maps").read_text()
        assert readable_memory_holds(agent.proc.pid, secret_needles(keys.device_key)) == []


def _release(agent: AgentProcess) -> int | None:
    import urllib.request

    with urllib.request.urlopen(agent.url + "/v1/status", timeout=10) as response:
        model = json.loads(response.read())["model"]
    return model["release"] if model else None


# -- crashes leave no core file, peers cannot read the memory ----------------------------------


def _core_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name == "core" or p.name.startswith("core.")]


def _core_pattern_writes_to_cwd() -> bool:
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    return not pattern.startswith("|") and "/" not in pattern


def _start_in(cwd: Path, command: str, *, without_capabilities: bool = False) -> subprocess.Popen[str]:
    """``command`` under ``ulimit -c unlimited`` in ``cwd`` (optionally with no capabilities)."""
    cwd.mkdir(exist_ok=True)
    drop = "setpriv --bounding-set=-all --inh-caps=-all -- " if without_capabilities else ""
    return subprocess.Popen(["bash", "-c", f"cd {cwd} && ulimit -c unlimited && exec {drop}{command}"], text=True)


def _lift_core_limit(pid: int) -> None:
    # As an admin's `prlimit --core=unlimited` would: then only the not-dumpable flag stops a
    # dump. Raising a hard limit needs CAP_SYS_RESOURCE; without it the limit stays as it is.
    try:
        resource.prlimit(pid, resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except PermissionError:
        pass


_SLEEPER = f"{sys.executable} -c 'import time; time.sleep(120)'"


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT], ids=["SIGSEGV", "SIGABRT"])
def test_a_crashing_agent_writes_no_core_file(tmp_path: Path, sig: int) -> None:
    """Attack: crash the daemon (or wait for it to crash) and read the core file for the
    plaintext model and keys. Started under ``ulimit -c unlimited``, the agent lowers its own
    core limit to 0 (soft and hard) and makes itself not dumpable; SIGSEGV/SIGABRT then leave
    no core file. A plain Python process under the very same conditions does leave one (the
    control), so the check can fail."""
    if not _core_pattern_writes_to_cwd():
        pytest.skip("kernel.core_pattern is not a plain file name: a core would not land in the cwd to be seen")
    control = _start_in(tmp_path / "control", _SLEEPER)
    time.sleep(1)
    _lift_core_limit(control.pid)
    os.kill(control.pid, sig)
    control.wait(60)
    if not _core_files(tmp_path / "control"):
        pytest.skip("this kernel/container writes no core file even for an unhardened process; nothing to compare")

    device = make_device(tmp_path / "dev")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    command = (
        f"cd {cwd} && ulimit -c unlimited && exec {sys.executable} -m edgesdk.agent.cli run --config {device.config}"
    )
    agent = AgentProcess(device, argv=["bash", "-c", command]).start()
    try:
        limits = Path(f"/proc/{agent.proc.pid}/limits").read_text()
        core_line = next(line for line in limits.splitlines() if line.startswith("Max core file size"))
        assert core_line.split()[4:6] == ["0", "0"], core_line  # soft and hard, though started unlimited
        _lift_core_limit(agent.proc.pid)
        os.kill(agent.proc.pid, sig)
        agent.proc.wait(60)
    finally:
        agent.stop()
    assert agent.proc.returncode == -sig
    assert _core_files(cwd) == []


def test_the_agent_is_not_dumpable_so_a_peer_cannot_read_its_memory(tmp_path: Path) -> None:
    """Attack: another process of the same user reads the daemon's memory (/proc/PID/mem,
    ptrace). The agent clears its dumpable flag, so without CAP_SYS_PTRACE that is refused;
    the same reader can read a plain process of that user (the control). Everything runs
    with no capabilities (setpriv), as a service user would; root's capabilities would let
    any reader in."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to run processes without capabilities")
    device = make_device(tmp_path / "dev")
    agent_command = f"{sys.executable} -m edgesdk.agent.cli run --config {device.config}"
    plain = _start_in(tmp_path / "plain", _SLEEPER, without_capabilities=True)
    agent = AgentProcess(
        device,
        argv=["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", *agent_command.split()],
    ).start()
    try:

        def peer_reads(pid: int) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", "head", "-c", "64", f"/proc/{pid}/maps"],
                capture_output=True,
                text=True,
                timeout=30,
            )

        control = peer_reads(plain.pid)
        assert control.returncode == 0 and control.stdout, control.stderr  # the reader can read a plain process
        refused = peer_reads(agent.proc.pid)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
    finally:
        agent.stop()
        plain.kill()
        plain.wait(10)
