"""install.sh refuses bad input before it changes anything (the full run is in
tests/integration/test_image_x86_install.py)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.image.recipes import common_dir


@pytest.fixture
def image(tmp_path: Path) -> Path:
    top = tmp_path / "edgesdk-image-test"
    top.mkdir()
    shutil.copyfile(common_dir() / "install.sh", top / "install.sh")
    shutil.copyfile(common_dir() / "layout.tsv", top / "layout.tsv")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    (top / "image.env").write_text(
        f"EDGESDK_IMAGE_PROFILE='test'\nEDGESDK_IMAGE_FAMILY='debian-x86_64'\nEDGESDK_IMAGE_PYTHON='{python}'\n"
        "EDGESDK_IMAGE_REQUIREMENT='edgesdk[agent]==0.0.0'\nEDGESDK_IMAGE_GROUPS='video'\n"
    )
    (top / "wheelhouse").mkdir()
    (top / "wheelhouse" / "placeholder.txt").write_text("not a wheel")
    sums = "".join(
        f"{hashlib.sha256((top / name).read_bytes()).hexdigest()}  {name}\n"
        for name in ("image.env", "layout.tsv", "wheelhouse/placeholder.txt")
    )
    (top / "SHA256SUMS").write_text(sums)
    return top


def run(image: Path, *args: str) -> subprocess.CompletedProcess[str]:
    root = image.parent / "root"
    return subprocess.run(
        ["bash", str(image / "install.sh"), "--root", str(root), *args], capture_output=True, text=True, timeout=60
    )


def test_bad_device_id_is_named(image: Path) -> None:
    proc = run(image, "--device-id", "bad id!")
    assert proc.returncode != 0 and "device id 'bad id!' is invalid" in proc.stderr
    assert not (image.parent / "root" / "opt").exists()


def test_device_id_defaults_to_a_valid_host_name(image: Path) -> None:
    # Without --device-id the host name is used; the run then stops at the missing Python.
    proc = run(image, "--python", "/nonexistent/python3")
    assert proc.returncode != 0 and "no Python at '/nonexistent/python3'" in proc.stderr, proc.stderr


def test_python_of_another_version_is_refused(image: Path) -> None:
    env_file = image / "image.env"
    env_file.write_text(env_file.read_text().replace("EDGESDK_IMAGE_PYTHON='", "EDGESDK_IMAGE_PYTHON='2."))
    sums = image / "SHA256SUMS"
    digest = hashlib.sha256(env_file.read_bytes()).hexdigest()
    sums.write_text("\n".join([f"{digest}  image.env", *sums.read_text().splitlines()[1:]]) + "\n")
    proc = run(image, "--device-id", "dev-1", "--python", sys.executable)
    assert proc.returncode != 0 and "wheels are for Python 2." in proc.stderr, proc.stderr


def test_a_changed_file_stops_the_install(image: Path) -> None:
    (image / "wheelhouse" / "placeholder.txt").write_text("swapped")
    proc = run(image, "--device-id", "dev-1")
    assert proc.returncode != 0 and "image is corrupt" in proc.stderr
    assert not (image.parent / "root" / "etc").exists()


def test_unknown_option_is_named(image: Path) -> None:
    proc = run(image, "--frobnicate")
    assert proc.returncode != 0 and "unknown option '--frobnicate'" in proc.stderr
