"""aarch64 images carry a complete wheelhouse: every requirement of ``edgesdk[agent,...]``
resolves from it, with no index, for the device's platform — a Raspberry Pi 5 (Raspberry Pi OS
bookworm, Python 3.11) with LiteRT, and a Jetson Orin Nano (JetPack 6, Python 3.10)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from edgesdk.image.wheelhouse import download_args
from edgesdk.profiles import get_profile
from tests.image_helpers import require_package_index

pytestmark = pytest.mark.slow


CASES = [
    ("rpi5-8gb", ["--extra", "litert"], "raspberry-pi-os-arm64", "3.11", ["ai_edge_litert-"]),
    ("jetson-orin-nano-8gb", [], "jetson-l4t", "3.10", []),
]


@pytest.mark.parametrize(("profile_name", "extra", "family", "python", "more_wheels"), CASES)
def test_aarch64_image_resolves_a_complete_wheelhouse(
    tmp_path: Path,
    edgesdk_cli,
    profile_name: str,
    extra: list[str],
    family: str,
    python: str,
    more_wheels: list[str],
) -> None:
    require_package_index()
    image = tmp_path / "image.tar.gz"
    build = edgesdk_cli(
        "image", "build", "--profile", profile_name, "--broker", "mqtts://fleet.example:8883",
        *extra, "--out", str(image), "--json",
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    manifest = json.loads(build.stdout)
    assert manifest["arch"] == "aarch64" and manifest["family"] == family
    assert manifest["python"] == python
    wheels = manifest["wheels"]
    compiled = [w for w in wheels if not w.endswith("-none-any.whl") and "py2.py3-none-any" not in w]
    assert compiled, wheels
    # Every compiled wheel is for aarch64 and the device's CPython (or the stable ABI), none for this machine.
    assert all("aarch64" in w for w in compiled), compiled
    cp = "cp" + python.replace(".", "")
    assert all(f"-{cp}-" in w or "-abi3-" in w for w in compiled), compiled
    assert not any("x86_64" in w for w in wheels), wheels
    for name in ("onnxruntime-", "numpy-", "cryptography-", "pydantic_core-", "psutil-", *more_wheels):
        assert any(w.startswith(name) for w in wheels), (name, wheels)

    unpacked = tmp_path / "unpacked"
    with tarfile.open(image) as tar:
        tar.extractall(unpacked, filter="data")
    (top,) = unpacked.iterdir()
    wheelhouse = top / "wheelhouse"
    assert sorted(p.name for p in wheelhouse.iterdir()) == sorted(wheels)
    # What the device's pip will do: resolve the requirement from the wheelhouse only.
    profile = get_profile(profile_name)
    dry_run = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--report", str(tmp_path / "report.json"),
            "--no-index", "--find-links", str(wheelhouse), "--target", str(tmp_path / "target"),
            *download_args(profile, python), manifest["requirement"],
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null", "HOME": str(tmp_path)},
        timeout=300,
    )  # fmt: skip
    assert dry_run.returncode == 0, dry_run.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    resolved = {item["metadata"]["name"].lower().replace("_", "-") for item in report["install"]}
    assert {"edgesdk", "onnxruntime", "paho-mqtt", "numpy", "cryptography"} <= resolved
    assert all(name.rstrip("-").replace("_", "-") in resolved for name in more_wheels)
    # Nothing in the wheelhouse is dead weight: everything resolved is there and vice versa.
    assert len(report["install"]) == len(wheels)
    assert not (top / "bundle").exists()
