"""The agent runs numpy's OpenBLAS on one thread (agent/cli.py, ``one_blas_thread``): a BLAS
worker woken beside the model's runtime for the NaN/Inf scan's dot products buys nothing."""

from __future__ import annotations

import os
import subprocess
import sys


def threads_around_numpy(one_thread: bool, **env: str) -> tuple[str, int, int]:
    """(OPENBLAS_NUM_THREADS as the process saw it, its threads before numpy loads, after a
    large dot product), in a fresh interpreter. Before and after, not an absolute count: an
    emulator (qemu-user on the arm64 lane) adds threads of its own."""
    code = f"""
import os, sys
import edgesdk.agent.cli as cli
assert "numpy" not in sys.modules, "numpy loaded before the entry point could set OpenBLAS's threads"
if {one_thread}:
    cli.one_blas_thread()
before = len(os.listdir("/proc/self/task"))
import numpy as np
x = np.ones(200_000, np.float32)
np.vdot(x, x)  # OpenBLAS has started its workers by now, if it starts any
print(os.environ.get("OPENBLAS_NUM_THREADS", "-"), before, len(os.listdir("/proc/self/task")))
"""
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True
    )
    setting, before, after = done.stdout.split()
    return setting, int(before), int(after)


def test_the_entry_point_leaves_openblas_one_thread_before_numpy_loads() -> None:
    setting, before, after = threads_around_numpy(True)
    assert setting == "1" and after == before


def test_without_it_openblas_would_start_workers_and_an_operators_setting_stays() -> None:
    setting, before, after = threads_around_numpy(False)
    assert setting == "-"
    if (os.cpu_count() or 1) > 1:
        assert after > before  # what the setting saves: a worker per further core
    setting, before, after = threads_around_numpy(True, OPENBLAS_NUM_THREADS="2")
    assert setting == "2"
    if (os.cpu_count() or 1) > 1:
        assert after > before
