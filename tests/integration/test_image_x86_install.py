"""A provisioning image, end to end on this machine: build it for an x86-64 profile, install it
into a fresh directory with the network cut off, start the agent exactly as the systemd unit's
ExecStart does, enroll the device, deliver a bundle encrypted to its key, infer.

The profile is the Intel NUC one re-based on this machine's OS (Debian 12: glibc 2.36, Python
3.11), so the wheelhouse resolved for the "device" also runs here.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization

from edgesdk.keys import generate_publisher_key, key_id, load_device_private_key, load_device_public_key
from tests.bundle_helpers import make_digits_convert_dir
from tests.image_helpers import parse_unit, require_package_index
from tests.integration.conftest import require_mosquitto

pytestmark = pytest.mark.slow

PROFILE = "nuc-py311"
DEVICE_ID = "nuc-line1-07"
MACHINE_TAGS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)] + ["manylinux2014_x86_64"]


def write_test_profile(directory: Path) -> Path:
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    profile = {
        "name": PROFILE,
        "extends": "intel-nuc-core-ultra",
        "display_name": "Intel NUC on Debian 12 (image test)",
        "platform": {
            "os": "Debian 12 bookworm",
            "arch": "x86_64",
            "glibc": "2.36",
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "wheel_platforms": MACHINE_TAGS,
        },
    }
    (directory / f"{PROFILE}.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return directory


def offline_env() -> dict[str, str]:
    """No index, no find-links of this machine, and a proxy that refuses: any download fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "EDGESDK_"))}
    env.update(
        PIP_NO_INDEX="1",
        PIP_CONFIG_FILE="/dev/null",
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
        http_proxy="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        ALL_PROXY="http://127.0.0.1:9",
    )
    return env


def unit_command(unit_file: Path) -> tuple[list[str], dict[str, str]]:
    """ExecStart's argv and the Environment= assignments of the installed unit."""
    service = parse_unit(unit_file.read_text())["Service"]
    argv = shlex.split(service["ExecStart"][-1])
    environment: dict[str, str] = {}
    for line in service.get("Environment", []):
        for assignment in shlex.split(line):
            key, _, value = assignment.partition("=")
            environment[key] = value
    return argv, environment


def http_json(url: str, body: dict | None = None, timeout: float = 10) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback
        return json.loads(response.read())


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"agent exited with {proc.returncode} while waiting for {what}:\n{log_text(log)}")
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{log_text(log)}")


class NotifyListener:
    """What systemd would receive on NOTIFY_SOCKET from a Type=notify service."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.5)
        self.seen: set[str] = set()

    def has(self, wanted: set[str]) -> bool:
        try:
            while True:
                self.seen.update(self.sock.recv(4096).decode().splitlines())
        except (TimeoutError, BlockingIOError):
            pass
        return wanted <= self.seen

    def close(self) -> None:
        self.sock.close()


class Sniffer:
    """Subscribes to the whole namespace and keeps every payload."""

    def __init__(self, broker_url: str) -> None:
        from edgesdk.mqtt.client import ClientOptions, MqttClient

        self._payloads: list[bytes] = []
        self._lock = threading.Lock()
        self.client = MqttClient(ClientOptions(client_id="sniffer", broker_url=broker_url, clean_start=True))
        self.client.on_message = self._on_message
        self.client.subscribe("edgesdk/#")
        self.client.start()
        assert self.client.wait_connected(60)

    def _on_message(self, _topic: str, payload: bytes) -> None:
        with self._lock:
            self._payloads.append(payload)

    def payloads(self) -> list[bytes]:
        with self._lock:
            return list(self._payloads)

    def stop(self) -> None:
        self.client.stop()


def log_text(log: Path | None) -> str:
    return log.read_text()[-4000:] if log is not None and log.exists() else ""


def test_image_installs_offline_enrolls_and_serves(tmp_path_factory, digits, mqtt_broker, edgesdk_cli) -> None:
    require_mosquitto()
    require_package_index()  # the image's wheelhouse is resolved from it
    work = tmp_path_factory.mktemp("img")
    profiles = write_test_profile(work / "profiles")
    publisher_key, publisher_pub = generate_publisher_key(work / "publisher")

    # -- operator: build the image -----------------------------------------------------------
    image = work / "nuc.tar.gz"
    started = time.monotonic()
    build = edgesdk_cli(
        "--profiles-dir",
        str(profiles),
        "image",
        "build",
        "--profile",
        PROFILE,
        "--broker",
        mqtt_broker.url,
        "--publisher-key",
        str(publisher_pub),
        "--api-port",
        "0",
        "--out",
        str(image),
        "--json",
    )
    assert build.returncode == 0, build.stderr
    print(f"image build: {time.monotonic() - started:.1f} s, {image.stat().st_size / 1e6:.1f} MB")
    assert "[2/4] resolving edgesdk[agent]" in build.stderr  # progress is shown
    manifest = json.loads(build.stdout)
    assert manifest["profile"] == PROFILE and manifest["family"] == "debian-x86_64"
    assert any(name.startswith("onnxruntime-") for name in manifest["wheels"])
    assert not any(name.startswith(("torch-", "onnx-", "openvino-")) for name in manifest["wheels"])

    # -- device: unpack into a fresh directory and install with no network ------------------------
    unpacked = work / "unpacked"
    with tarfile.open(image) as tar:
        tar.extractall(unpacked, filter="data")
    (top,) = unpacked.iterdir()
    root = work / "root"
    started = time.monotonic()
    install = subprocess.run(
        ["bash", str(top / "install.sh"), "--root", str(root), "--device-id", DEVICE_ID, "--python", sys.executable],
        capture_output=True,
        text=True,
        env=offline_env(),
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    print(f"offline install: {time.monotonic() - started:.1f} s")
    venv_python = root / "opt/edgesdk/venv/bin/python"
    freeze = subprocess.run([str(venv_python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True)
    assert "onnxruntime==" in freeze.stdout and "edgesdk==" in freeze.stdout
    assert "torch" not in freeze.stdout
    assert stat.S_IMODE((root / "var/lib/edgesdk").stat().st_mode) == 0o700

    # A corrupted image is refused before anything is installed.
    tampered = top / "wheelhouse" / manifest["wheels"][0]
    original = tampered.read_bytes()
    tampered.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    refused = subprocess.run(
        ["bash", str(top / "install.sh"), "--root", str(work / "root2"), "--python", sys.executable],
        capture_output=True,
        text=True,
        env=offline_env(),
    )
    tampered.write_bytes(original)
    assert refused.returncode != 0 and "SHA256SUMS" in refused.stderr
    assert not (work / "root2/opt/edgesdk/venv").exists()

    # -- device: start the agent the way systemd would ----------------------------------------
    argv, unit_environment = unit_command(root / "etc/systemd/system/edge-agent.service")
    assert argv[0] == str(root / "opt/edgesdk/venv/bin/edge-agent")
    env = {**offline_env(), **unit_environment, "HOME": str(work / "home")}
    env.pop("CI", None)
    data_dir = root / "var/lib/edgesdk"
    assert not (data_dir / "device.key").exists()
    log = work / "agent.log"
    wire = Sniffer(mqtt_broker.url)  # everything the device publishes, to prove what never leaves it
    # Like systemd for Type=notify + WatchdogSec: a notify socket and a watchdog timeout.
    notify = NotifyListener(work / "notify.sock")
    env.update(NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC="2000000")
    with open(log, "w") as log_handle:
        agent = subprocess.Popen(argv, stdout=log_handle, stderr=subprocess.STDOUT, env=env)
    try:
        port = int(
            wait_for(
                lambda: (data_dir / "api.port").exists() and (data_dir / "api.port").read_text().strip(),
                60,
                "the local API",
                agent,
                log,
            )
        )
        url = f"http://127.0.0.1:{port}"
        # The unit's Type=notify and WatchdogSec= hold: READY=1 once serving, then pings.
        wait_for(lambda: notify.has({"READY=1", "WATCHDOG=1"}), 60, "READY=1 and WATCHDOG=1", agent, log)
        status = http_json(f"{url}/v1/status")
        assert status["device_id"] == DEVICE_ID and status["profile"] == PROFILE  # the shipped profile
        assert status["model"] is None and status["link"] is True

        # Enrollment: the key pair was made on first start, private half 0600, on the device.
        private = data_dir / "device.key"
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
        device_public = load_device_public_key(data_dir / "device.pub")

        # Operator: the device waits for approval; approve it, pinning the key id it shows.
        registry_path = work / "enrollment.json"
        enroll = ("fleet", "enroll")
        registry_flags = ("--registry", str(registry_path), "--broker", mqtt_broker.url)

        def pending() -> dict | None:
            listed = edgesdk_cli(*enroll, "list", *registry_flags, "--wait", "0.5", "--json")
            assert listed.returncode == 0, listed.stderr
            rows = {row["device_id"]: row for row in json.loads(listed.stdout)}
            return rows.get(DEVICE_ID)

        offered = wait_for(pending, 60, "the device to announce its key", agent, log)
        assert offered["status"] == "pending" and offered["profile"] == PROFILE
        assert offered["offered_key_id"] == key_id(device_public)  # the broker shows what the device shows
        approved = edgesdk_cli(*enroll, "approve", DEVICE_ID, *registry_flags, "--key-id", key_id(device_public))
        assert approved.returncode == 0, approved.stderr
        assert pending()["status"] == "approved"

        # Operator: package for the approved keys; deliver it; the running agent loads it.
        convert = make_digits_convert_dir(digits, work / "convert", profile=PROFILE, int8=False)
        bundle = work / "digits-1.0.0.edgepkg"
        packaged = edgesdk_cli(
            "--profiles-dir", str(profiles), "package", str(convert), "--name", "digits", "--version", "1.0.0",
            "--release", "1", "--publisher-key", str(publisher_key),
            "--recipients-from-registry", str(registry_path), "--out", str(bundle), "--json",
        )  # fmt: skip
        assert packaged.returncode == 0, packaged.stderr
        assert json.loads(packaged.stdout)["recipients"] == [key_id(device_public)]
        # On the device, people use the installed wrapper (config and profiles preset).
        wrapper = root / "usr/local/bin/edge-agent"
        device_env = {**offline_env(), "HOME": str(work / "home")}
        shown = subprocess.run([str(wrapper), "key"], capture_output=True, text=True, env=device_env, timeout=60)
        assert shown.returncode == 0, shown.stderr
        # What the operator compares at approval: the full key id, then the public key itself.
        assert (
            shown.stdout.strip() == f"key id: {key_id(device_public)}\n" + (data_dir / "device.pub").read_text().strip()
        )
        sideload = subprocess.run(
            [str(wrapper), "install", str(bundle)], capture_output=True, text=True, env=device_env, timeout=120
        )
        assert sideload.returncode == 0, sideload.stderr
        wait_for(lambda: http_json(f"{url}/v1/status")["model"], 60, "the model to load", agent, log)

        validation = np.load(digits.validation)
        images, labels = validation["image"][:32], validation["labels"][:32]

        def infer() -> dict:
            answer = http_json(f"{url}/v1/models/digits/infer", {"inputs": {"image": images.tolist()}})
            predicted = np.asarray(answer["outputs"]["logits"]).argmax(1)
            assert (predicted == labels).mean() >= 0.9, (predicted, labels)
            return answer

        assert infer()["version"] == "1.0.0"

        # Operator: v2 over the air, packaged for the approved keys, pushed as a rollout.
        bundle_v2 = work / "digits-2.0.0.edgepkg"
        packaged = edgesdk_cli(
            "--profiles-dir", str(profiles), "package", str(convert), "--name", "digits", "--version", "2.0.0",
            "--release", "2", "--publisher-key", str(publisher_key),
            "--recipients-from-registry", str(registry_path), "--out", str(bundle_v2),
        )  # fmt: skip
        assert packaged.returncode == 0, packaged.stderr
        pushed = edgesdk_cli(
            "fleet", "push", str(bundle_v2), "--broker", mqtt_broker.url, "--devices", DEVICE_ID,
            "--canary", "100%", "--waves", "100%", "--probation", "1s", "--wave-timeout", "90s",
            "--operator-key", str(publisher_key), "--db", str(work / "fleet.sqlite3"), "--json",
        )  # fmt: skip
        assert pushed.returncode == 0, pushed.stderr + log_text(log)
        assert infer()["version"] == "2.0.0"

        # The private key never left the device: not in any form in anything it published.
        private_raw = load_device_private_key(private).private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        published = wire.payloads()
        # Positive control: the public half is on the wire (that is how it got enrolled).
        public_b64 = base64.b64encode(device_public.public_bytes_raw())
        assert any(public_b64 in payload for payload in published)
        for secret in (private_raw, base64.b64encode(private_raw), private_raw.hex().encode(), private.read_bytes()):
            assert not any(secret in payload for payload in published)
    finally:
        notify.close()
        wire.stop()
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(10)
    assert agent.returncode == 0, log_text(log)
