"""The NaN/Inf scan's dot product on numpy's OpenBLAS with one thread and with its default
(issue 15; why ``edge-agent`` sets ``OPENBLAS_NUM_THREADS=1``): wall and CPU time per call on a
MobileNetV2-sized float32 input, each setting in a fresh interpreter (OpenBLAS reads it once).

    .venv/bin/python benchmarks/probe_blas_threads.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

MEASURE = """
import os, time
import numpy as np
x = np.random.default_rng(0).random(150_528, dtype=np.float32)  # 1x3x224x224
np.vdot(x, x)
cpu, wall = time.process_time(), time.perf_counter()
for _ in range({calls}):
    np.vdot(x, x)
    x[:10].copy()  # a little other work between calls, as a server does
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(len(os.listdir("/proc/self/task")), wall / {calls} * 1e6, cpu / {calls} * 1e6)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    print("| OPENBLAS_NUM_THREADS | threads | wall µs/call | CPU µs/call |\n| --- | ---: | ---: | ---: |")
    for setting in ("1", None):
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        if setting is not None:
            env["OPENBLAS_NUM_THREADS"] = setting
        done = subprocess.run(
            [sys.executable, "-c", MEASURE.format(calls=args.calls)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        threads, wall, cpu = done.stdout.split()
        print(f"| {setting or '(default)'} | {threads} | {float(wall):.1f} | {float(cpu):.1f} |")


if __name__ == "__main__":
    main()
