"""Where the NaN/Inf scan of a large input costs least: before the run, or on another thread
during it (issue 15, BENCHMARKS.md "Eighth session").

MobileNetV2 (the benchmarks' ONNX export) on onnxruntime, its 602 KB input written just before
each call (as a request's body is), four ways per call: no scan; the scan before the run
(``first_nonfinite``, what the agent does where the run takes every core); the agent's
``ScanThread`` (polled, what it does where a run leaves a core idle); a thread woken per job
(a blocking queue). Rounds interleave the four and rotate their order; per round the median
wall time of ``--calls`` calls and the process's CPU time (all threads) per call; printed: the
median over rounds of each one's ratio to no scan.

    .venv/bin/python benchmarks/probe_scan_placement.py [--threads 0] [--rounds 16] [--calls 25]

``--threads 0`` is onnxruntime's default (one intra-op thread per core: the runtime takes every
core); ``--threads 1`` leaves the other cores idle during the run.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


class WokenScans:
    """A scan thread that blocks until each job comes (the waker pays the wake-up)."""

    def __init__(self, scan: Callable[[Sequence[tuple[str, Any]]], str | None]) -> None:
        self.scan = scan
        self.jobs: queue.SimpleQueue[list[Any]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            if job[1].acquire(False):  # not taken back by its request
                job[3] = self.scan(job[0])
                job[2].release()

    def submit(self, inputs: Sequence[tuple[str, Any]]) -> list[Any]:
        done = threading.Lock()
        done.acquire()
        job = [inputs, threading.Lock(), done, None]
        self.jobs.put(job)
        return job

    def result(self, job: list[Any]) -> str | None:
        if job[2].acquire(False):
            return job[3]  # type: ignore[no-any-return]
        if job[1].acquire(False):
            return self.scan(job[0])  # not picked up yet: scan it here
        job[2].acquire()
        return job[3]  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--calls", type=int, default=25, help="calls per case and round")
    args = parser.parse_args()
    import numpy as np
    import onnxruntime as ort
    from bench_api import mobilenet_convert_dir
    from edgesdk.agent.nonfinite import ScanThread, first_nonfinite

    from edgesdk.offline import disable_vendor_telemetry
    from edgesdk.workloads import mobilenet

    disable_vendor_telemetry()
    convert = mobilenet_convert_dir(ROOT / ".pytest_cache" / "d" / "bench-api-mobilenet-fp32")
    x = np.ascontiguousarray(mobilenet.preprocess(mobilenet.sample_images()[0][1]), np.float32)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if args.threads:
        options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(
        str(convert / "artifacts" / "onnx-fp32" / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    name = session.get_inputs()[0].name
    outputs = [o.name for o in session.get_outputs()]
    template = x.tobytes()
    polled, woken = ScanThread(), WokenScans(first_nonfinite)

    def call(case: str) -> None:
        feed = np.frombuffer(bytearray(template), np.float32).reshape(x.shape)  # as a body just read
        inputs = [(name, feed)]
        if case == "scan before the run":
            if first_nonfinite(inputs) is not None:
                raise SystemExit("the sample holds NaN/Inf")
            session.run(outputs, {name: feed})
        elif case == "no scan":
            session.run(outputs, {name: feed})
        else:
            scans: Any = polled if case == "scan thread, polled" else woken
            job = scans.submit(inputs)
            session.run(outputs, {name: feed})
            if scans.result(job) is not None:
                raise SystemExit("the sample holds NaN/Inf")

    cases = ["no scan", "scan before the run", "scan thread, polled", "scan thread, woken per job"]
    wall: dict[str, list[float]] = {c: [] for c in cases}
    cpu: dict[str, list[float]] = {c: [] for c in cases}
    for round_index in range(args.rounds):
        shift = round_index % len(cases)
        for case in cases[shift:] + cases[:shift]:
            for _ in range(3):
                call(case)  # the scan thread is polling (or woken) when the timed calls start
            times = []
            cpu_start = time.process_time()
            for _ in range(args.calls):
                start = time.perf_counter()
                call(case)
                times.append(time.perf_counter() - start)
            cpu[case].append((time.process_time() - cpu_start) / args.calls)
            wall[case].append(statistics.median(times))
    threads = args.threads or "onnxruntime default"
    print(f"MobileNetV2, intra-op threads: {threads}; {args.rounds} rounds of {args.calls} calls per case\n")
    print(
        "| case | wall ms (median) | CPU ms per call | wall ÷ no scan | CPU ÷ no scan |\n| --- | ---: | ---: | ---: | ---: |"
    )
    for case in cases:
        wall_ratio = statistics.median(a / b for a, b in zip(wall[case], wall["no scan"], strict=True))
        cpu_ratio = statistics.median(a / b for a, b in zip(cpu[case], cpu["no scan"], strict=True))
        print(
            f"| {case} | {statistics.median(wall[case]) * 1e3:.3f} | {statistics.median(cpu[case]) * 1e3:.3f} "
            f"| {wall_ratio:.3f} | {cpu_ratio:.3f} |"
        )


if __name__ == "__main__":
    main()
