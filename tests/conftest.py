"""Shared fixtures. The digits CNN is trained once per machine and cached under pytest's
cache directory, so every tier can use a real model without paying for training twice."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
from pathlib import Path

import pytest


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The folder decides the tier marker, so a test cannot end up in no tier.
    for item in items:
        path = Path(str(item.fspath))
        for tier in ("unit", "contract", "integration"):
            if f"tests/{tier}/" in path.as_posix() or f"tests\\{tier}\\" in str(path):
                item.add_marker(getattr(pytest.mark, tier))


#: Import names of the ``agent`` extra (pyproject.toml), for the ``needs_agent_extra`` marker.
AGENT_EXTRA_MODULES = ("paho.mqtt", "onnxruntime", "psutil")


def _missing(modules: tuple[str, ...]) -> list[str]:
    missing = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # the parent package ("paho" of "paho.mqtt") is not there
            found = False
        if not found:
            missing.append(module)
    return missing


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_agent_extra") is not None:
        missing = _missing(AGENT_EXTRA_MODULES)
        if missing:
            pytest.skip(f"needs the agent extra, missing {', '.join(missing)} (pip install 'edgesdk[agent]')")


@pytest.fixture(autouse=True)
def _umask_restored():
    """Each test starts with the umask the session started with: code run in process (``fleet
    serve`` makes its files private with umask 077) must not change the modes later tests in the
    same worker create (a venv made under 077 was unreadable to another user)."""
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)


@pytest.fixture(scope="session")
def digits(request: pytest.FixtureRequest):
    """The trained digits CNN and its ONNX export, calibration and validation data."""
    if not (_has("torch") and _has("sklearn")):
        pytest.skip("digits fixture needs torch and scikit-learn (pip install 'edgesdk[convert]')")
    from edgesdk.workloads.digits import prepare_digits

    cache_dir = Path(request.config.cache.mkdir("edgesdk-digits-v1"))
    # scripts/test runs the arm64 lane's pytest beside the suite's, on the same cache folder: one
    # trains and writes while the other waits, then finds the files whole (the lock is a sibling
    # file, so removing a half-written cache below never removes the lock someone holds).
    with (cache_dir.parent / "edgesdk-digits-v1.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return prepare_digits(cache_dir)
        except Exception:
            shutil.rmtree(cache_dir, ignore_errors=True)  # a half-written cache must not poison later runs
            raise


@pytest.fixture
def edgesdk_cli():
    """Run the real ``edgesdk`` command in a subprocess; returns the CompletedProcess."""
    import subprocess
    import sys

    def invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgesdk.cli.main", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )

    return invoke


def assert_one_line_error(proc, *needles: str) -> None:
    """A CLI failure is one clear line naming the bad value, a non-zero exit, no traceback.

    Progress lines before it (``edgesdk convert`` off a terminal, edgesdk/cli/output.py) are the
    steps that ran, not part of the error."""
    from edgesdk.cli.output import PROGRESS_LINE

    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not PROGRESS_LINE.match(line)]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
