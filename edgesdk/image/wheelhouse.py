"""The wheels a device needs, resolved on the operator's machine for the device's platform.

pip matches platform tags exactly (a ``manylinux_2_35_aarch64`` wheel is not picked with only
``manylinux2014_aarch64`` given), so the download passes every tag the profile lists, up to the
device's glibc, together with the device's Python version: the wheelhouse then holds what
``pip install --no-index`` on the device will ask for, and nothing built for this machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from edgesdk.errors import ImageError
from edgesdk.schemas.profile import DeviceProfile

# What the agent's wheel declares (requires-python); the fallback applies to a source tree
# whose metadata cannot be read.
_FALLBACK_MIN_PYTHON = (3, 10)
# Folders of the checkout that are not part of the wheel: copying them would only cost time.
_NOT_IN_WHEEL = (".git", ".venv", "build", "dist", "tests", "benchmarks", "examples", "docs", "out", "shared")


def min_python() -> tuple[int, int]:
    """The lowest Python the edgesdk agent supports."""
    try:
        spec = metadata.metadata("edgesdk")["Requires-Python"] or ""
    except metadata.PackageNotFoundError:
        spec = ""
    found = re.search(r">=\s*(\d+)\.(\d+)", spec)
    return (int(found.group(1)), int(found.group(2))) if found else _FALLBACK_MIN_PYTHON


def device_python(profile: DeviceProfile) -> str:
    """The profile's Python as ``X.Y``, if the agent can run on it; else ImageError naming it."""
    python = profile.platform.python
    need = "{}.{}".format(*min_python())
    if python is None:
        raise ImageError(
            f"profile {profile.name!r} ({profile.platform.os}) has no system Python; the agent needs Python >= {need}"
        )
    found = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", python)
    if found is None:
        raise ImageError(f"profile {profile.name!r}: platform.python {python!r} is not a version like '3.11'")
    version = (int(found.group(1)), int(found.group(2)))
    if version < min_python():
        raise ImageError(
            f"profile {profile.name!r} ships Python {python} ({profile.platform.os}); the agent needs "
            f"Python >= {need}: upgrade the device's OS image or use a profile for a newer release"
        )
    if not profile.platform.wheel_platforms:
        raise ImageError(f"profile {profile.name!r} lists no platform.wheel_platforms to resolve wheels for")
    return f"{version[0]}.{version[1]}"


def find_checkout() -> Path | None:
    """The source tree edgesdk runs from, when it is an editable checkout (has pyproject.toml)."""
    import edgesdk

    root = Path(edgesdk.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "edgesdk"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def _pip(args: list[str], *, what: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith("ERROR")]
        detail = errors[0] if errors else (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ImageError(f"{what} failed: {detail.removeprefix('ERROR: ')}")
    return proc


def build_edgesdk_wheel(checkout: Path, out_dir: Path) -> Path:
    """``pip wheel --no-deps`` of the checkout, from a copy so the shared tree gets no build/."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgesdk-wheel-src-") as tmp:
        source = Path(tmp) / "src"
        shutil.copytree(
            checkout,
            source,
            ignore=shutil.ignore_patterns(*_NOT_IN_WHEEL, "__pycache__", "*.egg-info", ".*_cache", "*.pyc"),
        )
        # The build backend (setuptools) is already here; isolation would fetch it from an index.
        _pip(
            ["wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out_dir), str(source)],
            what="building the edgesdk wheel",
        )
    wheels = sorted(out_dir.glob("edgesdk-*.whl"))
    if not wheels:
        raise ImageError(f"building the edgesdk wheel produced no edgesdk-*.whl in {out_dir}")
    return wheels[-1]


def download_args(profile: DeviceProfile, python: str) -> list[str]:
    """The pip options that select wheels for the device instead of this machine."""
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", python]
    for tag in profile.platform.wheel_platforms:
        args += ["--platform", tag]
    return args


def download_wheelhouse(
    edgesdk_wheel: Path, extras: list[str], profile: DeviceProfile, python: str, dest: Path
) -> list[Path]:
    """Download the wheel's dependencies (with ``extras``) for the device into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    requirement = f"{edgesdk_wheel.resolve()}[{','.join(extras)}]"
    _pip(
        ["download", "--dest", str(dest), *download_args(profile, python), requirement],
        what=f"resolving the wheelhouse for {profile.name} (Python {python}, {profile.platform.arch})",
    )
    return sorted(dest.glob("*.whl"))
