"""What coalescing tiny requests could save per request (issue 15, BENCHMARKS.md "Eleventh
session"): in process, the digits CNN on one onnxruntime session with one intra-op thread (what
the agent chooses for it), N requests answered one run each against one run of the N stacked
(``np.concatenate`` of the N inputs, the run, each request's row of the output as its own
bytes: what a batcher adds around the run). Interleaved repeats, medians, µs per request.

    .venv/bin/python benchmarks/probe_batch_gain.py [--repeats 15]

A bound for the event loop's own coalescing of requests that arrive in one wake-up (not built):
it leaves out the per-request costs that stay (HTTP, decode, encode, checks) and what a batch
adds on the loop (a deferred call, answers written after the batch's run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SIZES = (1, 2, 4, 8, 16)
CALLS = 200  # requests per timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    import onnxruntime as ort

    from edgesdk.workloads.digits import prepare_digits
    from tests.bundle_helpers import make_digits_convert_dir

    cache = ROOT / ".pytest_cache" / "d"
    digits = prepare_digits(cache / "edgesdk-digits-v1")
    model = make_digits_convert_dir(digits, cache / "bench-api-digits-fp32", int8=False) / "artifacts" / "onnx-fp32"
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model / "model.onnx"), options, providers=["CPUExecutionProvider"])
    run = session._sess.run  # the native call, as the agent makes it (onnxruntime_backend._session_run)
    name, output = session.get_inputs()[0].name, session.get_outputs()[0].name
    images = np.load(digits.validation)["image"][:CALLS].astype(np.float32)  # (CALLS, 1, 8, 8)
    requests = [images[i : i + 1].copy() for i in range(CALLS)]

    def alone(size: int) -> float:
        started = time.perf_counter()
        for x in requests[: CALLS // size * size]:
            run([output], {name: x}, None)[0].tobytes()
        return (time.perf_counter() - started) / (CALLS // size * size)

    def stacked(size: int) -> float:
        started = time.perf_counter()
        for at in range(0, CALLS // size * size, size):
            (out,) = run([output], {name: np.concatenate(requests[at : at + size])}, None)
            for row in range(size):
                out[row : row + 1].tobytes()
        return (time.perf_counter() - started) / (CALLS // size * size)

    for size in SIZES:  # warm-up: each batch shape once (onnxruntime plans memory per shape)
        stacked(size)
    timings: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for size in SIZES:
            for kind, measure in (("alone", alone), ("stacked", stacked)):
                timings.setdefault((kind, size), []).append(measure(size))
    print(f"digits CNN, one intra-op thread, {CALLS} requests per timing, {args.repeats} repeats (medians)\n")
    print("| requests per run | µs per request, one run each | µs per request, stacked | stacked ÷ alone |")
    print("| ---: | ---: | ---: | ---: |")
    for size in SIZES:
        one = statistics.median(timings[("alone", size)]) * 1e6
        many = statistics.median(timings[("stacked", size)]) * 1e6
        print(f"| {size} | {one:.1f} | {many:.1f} | {many / one:.2f} |")


if __name__ == "__main__":
    main()
