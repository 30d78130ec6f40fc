"""The arm64 lane's fixtures: where the device side runs, and the image installed there.

``scripts/test-arm64`` prepares the device side and says where it is in the environment:

- ``EDGESDK_ARM64_MODE=chroot``: an arm64 Debian root file system at ``EDGESDK_ARM64_ROOT``,
  run under qemu-user through binfmt_misc; pytest's ``--basetemp`` is bind-mounted into it at the
  same path, so every file the tests make (keys, bundles, data dirs) has one path on both sides.
  The chroot shares this machine's network namespace: its agent reaches a broker on 127.0.0.1.
- ``EDGESDK_ARM64_MODE=on-device``: this machine is the board; the image is staged under
  ``EDGESDK_ARM64_STAGE`` with ``install.sh --root``.

Without either the lane skips, naming the script. The tests themselves run on this machine (or
the board) with the project's venv: they build the image and the bundles, run the broker and the
operator's side, and start the agent *on the device side* as the existing process tests do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

# The broker fixture of the integration tier: a real mosquitto on an ephemeral port, on loopback.
from tests.integration.conftest import mqtt_broker  # noqa: F401

#: What the agent's process imports on a device with the profile's runtimes (module, why).
AGENT_IMPORTS = (
    "edgesdk.agent.daemon",
    "edgesdk.agent.unseal",
    "edgesdk.agent.ota.states",
    "edgesdk.agent.api.app",
    "onnxruntime",
    "paho.mqtt.client",
    "psutil",
    "httptools",
    "uvloop",
    "orjson",
    "simdjson",
    "cryptography.hazmat.primitives.ciphers.aead",
    "pydantic_core",
    "numpy",
    "yaml",
)
EXTRA_IMPORTS = {"litert": "ai_edge_litert.interpreter", "openvino": "openvino"}
# What the device's processes get: nothing of this machine's environment.
DEVICE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
LANE_DIR = "/opt/edgesdk-lane"  # the tests package, copied in (never the source tree's edgesdk/)


@dataclass(frozen=True)
class DeviceSide:
    """How to run a command on the device side, and what was installed there."""

    mode: str  # "chroot" or "on-device"
    root: Path  # the chroot's root ("/" on the device)
    prefix: str  # where install.sh put the image, as the device sees it ("" = the system itself)
    profile: str
    python: str
    extras: tuple[str, ...]

    @property
    def venv_python(self) -> str:
        return f"{self.prefix}/opt/edgesdk/venv/bin/python"

    def host_path(self, device_path: str) -> Path:
        """A path as the device sees it, from this side."""
        return self.root / device_path.lstrip("/") if self.mode == "chroot" else Path(device_path)

    def argv(self, *command: str, offline: bool = False, env: dict[str, str] | None = None) -> list[str]:
        """``command`` run on the device side with a clean environment (plus ``env``).

        ``offline``: in a new network namespace with only its own loopback (no network at all;
        the unit tier's servers still listen on 127.0.0.1)."""
        variables = {"PATH": DEVICE_PATH, "HOME": "/root", "LANG": "C.UTF-8", **(env or {})}
        inner = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in variables.items()), *command]
        if self.mode == "chroot":
            inner = ["chroot", str(self.root), *inner]
        if not offline:
            return inner
        return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "offline", *inner]

    def run(
        self, *command: str, offline: bool = False, env: dict[str, str] | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*command, offline=offline, env=env), capture_output=True, text=True, timeout=timeout
        )


def _device_side() -> DeviceSide:
    mode = os.environ.get("EDGESDK_ARM64_MODE")
    if mode not in ("chroot", "on-device"):
        pytest.skip("the arm64 lane runs through scripts/test-arm64 (it prepares the arm64 root file system)")
    profile = os.environ["EDGESDK_ARM64_PROFILE"]
    python = os.environ["EDGESDK_ARM64_PYTHON"]
    extras = tuple(os.environ.get("EDGESDK_ARM64_EXTRAS", "").split())
    if mode == "chroot":
        root = Path(os.environ["EDGESDK_ARM64_ROOT"])
        return DeviceSide(mode, root, "", profile, python, extras)
    stage = os.environ["EDGESDK_ARM64_STAGE"]
    return DeviceSide(mode, Path("/"), stage, profile, python, extras)


@pytest.fixture(scope="session")
def device_side() -> DeviceSide:
    return _device_side()


@pytest.fixture(scope="session")
def installed_image(device_side: DeviceSide, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The image for the lane's profile built from this working tree, installed on the device
    side with no network; returns the build's manifest (``edgesdk image build --json``)."""
    import json
    import sys

    from tests.image_helpers import require_package_index

    require_package_index()  # the image's wheelhouse is resolved from it (pip's cache keeps the files)
    work = tmp_path_factory.mktemp("image")
    image = work / "image.tar.gz"
    extras = [arg for extra in device_side.extras for arg in ("--extra", extra)]
    build = subprocess.run(
        [
            sys.executable, "-m", "edgesdk.cli.main", "image", "build", "--profile", device_side.profile,
            "--broker", "mqtt://127.0.0.1:1883", *extras, "--out", str(image), "--json",
        ],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    print(build.stderr)
    manifest = json.loads(build.stdout)
    with tarfile.open(image) as tar:
        tar.extractall(work / "unpacked", filter="data")
    (top,) = (work / "unpacked").iterdir()
    # The lane's device id; --no-start: there is no systemd in a chroot (the tests start the agent).
    args = ["bash", str(top / "install.sh"), "--device-id", "pi-lane-1", "--no-start"]
    if device_side.prefix:
        args += ["--root", device_side.prefix]
    install = device_side.run(*args, offline=True, timeout=1800)
    assert install.returncode == 0, install.stdout + install.stderr
    print(install.stdout)
    # The tests package on the device side (the harness that plants faults runs there).
    lane = device_side.host_path(LANE_DIR)
    shutil.rmtree(lane, ignore_errors=True)
    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / "tests", lane / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(repo / "pyproject.toml", lane / "pyproject.toml")  # pytest's markers and settings
    return manifest


@pytest.fixture
def lane_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh folder under --basetemp (so at the same path on the device side)."""
    return tmp_path_factory.mktemp("lane")
