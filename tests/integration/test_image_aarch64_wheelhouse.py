"""An aarch64 image (Raspberry Pi 5) carries a complete wheelhouse: every requirement of
``edgesdk[agent]`` resolves from it for the Pi's platform with no index."""

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


def test_rpi5_image_resolves_a_complete_aarch64_wheelhouse(tmp_path: Path, edgesdk_cli) -> None:
    require_package_index()
    image = tmp_path / "rpi5.tar.gz"
    build = edgesdk_cli(
        "image", "build", "--profile", "rpi5-8gb", "--broker", "mqtts://fleet.example:8883",
        "--extra", "litert", "--out", str(image), "--json",
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    manifest = json.loads(build.stdout)
    assert manifest["arch"] == "aarch64" and manifest["family"] == "raspberry-pi-os-arm64"
    assert manifest["python"] == "3.11"
    wheels = manifest["wheels"]
    compiled = [w for w in wheels if not w.endswith("-none-any.whl") and "py2.py3-none-any" not in w]
    assert compiled, wheels
    # Every compiled wheel is for aarch64 and for CPython 3.11 (or the stable ABI), none for this x86 machine.
    assert all("aarch64" in w for w in compiled), compiled
    assert not any("x86_64" in w for w in wheels), wheels
    for name in ("onnxruntime-", "ai_edge_litert-", "numpy-", "cryptography-", "pydantic_core-", "psutil-"):
        assert any(w.startswith(name) for w in wheels), (name, wheels)

    unpacked = tmp_path / "unpacked"
    with tarfile.open(image) as tar:
        tar.extractall(unpacked, filter="data")
    (top,) = unpacked.iterdir()
    wheelhouse = top / "wheelhouse"
    assert sorted(p.name for p in wheelhouse.iterdir()) == sorted(wheels)
    # What the Pi's pip will do: resolve edgesdk[agent,litert] from the wheelhouse only.
    profile = get_profile("rpi5-8gb")
    dry_run = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--report", str(tmp_path / "report.json"),
            "--no-index", "--find-links", str(wheelhouse), "--target", str(tmp_path / "target"),
            *download_args(profile, "3.11"), manifest["requirement"],
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null", "HOME": str(tmp_path)},
        timeout=300,
    )  # fmt: skip
    assert dry_run.returncode == 0, dry_run.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    resolved = {item["metadata"]["name"].lower().replace("_", "-") for item in report["install"]}
    assert {"edgesdk", "onnxruntime", "ai-edge-litert", "paho-mqtt", "numpy", "cryptography"} <= resolved
    # Nothing in the wheelhouse is dead weight: everything resolved is there and vice versa.
    assert len(report["install"]) == len(wheels)
    assert not (top / "bundle").exists()
