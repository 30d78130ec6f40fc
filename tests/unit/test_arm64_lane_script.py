"""scripts/test-arm64's refusals, which happen before it touches anything: what scripts/test
sees on a machine that cannot run the lane (a visible skip, exit 0), and bad arguments."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test-arm64"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
    )


def test_a_machine_that_cannot_run_it_is_a_visible_skip_under_if_possible(tmp_path) -> None:
    missing = str(tmp_path / "no-venv")
    skipped = run("--if-possible", EDGESDK_VENV=missing)
    assert skipped.returncode == 0, skipped.stderr
    assert f"==> arm64 lane SKIPPED: no {missing}" in skipped.stdout
    # Asked for directly, the same reason is an error.
    refused = run(EDGESDK_VENV=missing)
    assert refused.returncode == 1 and f"test-arm64: error: no {missing}" in refused.stderr


def test_an_unknown_suite_names_the_known_ones() -> None:
    proc = run("--suite", "buster")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "test-arm64: error: unknown suite 'buster' (known: bookworm, jammy)"
