"""The agent runs numpy's OpenBLAS on one thread (agent/cli.py, ``one_blas_thread``): a spinning
BLAS worker would take a core from the model's runtime for the NaN/Inf scan's dot products."""

from __future__ import annotations

import os
import subprocess
import sys


def run(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


COUNT_THREADS = """
import sys
import edgesdk.agent.cli as cli
assert "numpy" not in sys.modules, "numpy loaded before the entry point could set OpenBLAS's threads"
cli.one_blas_thread()
import os
import numpy as np
x = np.ones(200_000, np.float32)
np.vdot(x, x)  # OpenBLAS has started its workers by now, if it starts any
print(os.environ["OPENBLAS_NUM_THREADS"], len(os.listdir("/proc/self/task")))
"""


def test_the_entry_point_leaves_openblas_one_thread_before_numpy_loads() -> None:
    setting, threads = run(COUNT_THREADS).split()
    assert setting == "1" and threads == "1"


def test_without_it_openblas_would_start_workers_and_an_operators_setting_stays() -> None:
    # What the setting saves: on a machine with more than one core OpenBLAS starts workers.
    baseline = run(
        "import os, numpy as np; np.vdot(np.ones(200_000, np.float32), np.ones(200_000, np.float32)); "
        "print(len(os.listdir('/proc/self/task')))"
    )
    if (os.cpu_count() or 1) > 1:
        assert int(baseline) > 1
    setting, threads = run(COUNT_THREADS, OPENBLAS_NUM_THREADS="2").split()
    assert setting == "2"
    if (os.cpu_count() or 1) > 1:
        assert int(threads) > 1
