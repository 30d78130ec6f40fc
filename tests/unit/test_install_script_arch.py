"""install.sh of an image for another CPU stops first, with one line that names both CPUs and
how to build the right image, instead of pip's "No matching distribution found for pyyaml"."""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.image.builder import write_install_files
from edgesdk.image.recipes import recipe_for
from edgesdk.profiles import get_profile


def _this_machine() -> str:
    machine = platform.machine()
    return {"arm64": "aarch64", "amd64": "x86_64", "AMD64": "x86_64"}.get(machine, machine)


def _stage(top: Path, profile_name: str) -> Path:
    """The install files of a real image for ``profile_name``, as the builder writes them, with a
    one-file wheelhouse: enough for install.sh to run up to pip (the full run is in
    tests/integration/test_image_x86_install.py)."""
    profile = get_profile(profile_name)
    top.mkdir()
    write_install_files(
        top,
        recipe=recipe_for(profile),
        profile=profile,
        python=profile.platform.python or "3.11",
        requirement="edgesdk[agent]==0.0.0",
    )
    (top / "wheelhouse").mkdir()
    (top / "wheelhouse" / "placeholder.txt").write_text("not a wheel")
    names = ["image.env", "install.sh", "layout.tsv", "wheelhouse/placeholder.txt"]
    sums = "".join(f"{hashlib.sha256((top / n).read_bytes()).hexdigest()}  {n}\n" for n in names)
    (top / "SHA256SUMS").write_text(sums)
    return top


def _install(top: Path, *args: str) -> subprocess.CompletedProcess[str]:
    root = top.parent / "root"
    return subprocess.run(
        ["bash", str(top / "install.sh"), "--root", str(root), "--device-id", "dev-1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_image_for_another_cpu_stops_before_pip(tmp_path: Path) -> None:
    machine = _this_machine()
    if machine not in ("x86_64", "aarch64"):
        pytest.skip(f"no profile of another CPU chosen for a {machine} machine")
    other = "rpi5-8gb" if machine == "x86_64" else "intel-nuc-core-ultra"
    other_arch = get_profile(other).platform.arch
    top = _stage(tmp_path / "image", other)
    proc = _install(top, "--python", sys.executable)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"this image is for {other_arch} ({other}); this machine is {machine}" in lines[0], lines[0]
    assert "edgesdk image build --profile" in lines[0], lines[0]
    assert proc.stdout == ""  # stopped before its first step: no venv, no pip
    assert not (tmp_path / "root").exists()


def test_an_image_for_this_cpu_passes_the_check(tmp_path: Path) -> None:
    machine = _this_machine()
    profile = {"x86_64": "intel-nuc-core-ultra", "aarch64": "rpi5-8gb"}.get(machine)
    if profile is None:
        pytest.skip(f"no profile chosen for a {machine} machine")
    top = _stage(tmp_path / "image", profile)
    # The run goes past the CPU check and stops at the next one it can fail here: the Python.
    proc = _install(top, "--python", "/nonexistent/python3")
    assert proc.returncode == 1 and "no Python at '/nonexistent/python3'" in proc.stderr, proc.stderr
    assert "this image is for" not in proc.stderr
