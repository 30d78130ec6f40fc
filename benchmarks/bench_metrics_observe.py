"""Per-request cost of recording a latency: ``Metrics.observe`` (rolling window + histogram).

Run it on two checkouts to compare (it prints, it asserts nothing):

    python benchmarks/bench_metrics_observe.py
"""

from __future__ import annotations

import random
import time

from edgesdk.agent.metrics import Metrics


def main() -> None:
    random.seed(1)
    latencies = [random.lognormvariate(-7, 1.5) for _ in range(2000)]  # ~1 ms median, long tail
    metrics = Metrics(max_samples=8192)
    observe = metrics.observe
    for seconds in latencies * 5:  # past max_samples: the window evicts, as in a long run
        observe("onnx-fp32", seconds)
    best = float("inf")
    for _ in range(200):
        started = time.perf_counter()
        for seconds in latencies:
            observe("onnx-fp32", seconds)
        best = min(best, (time.perf_counter() - started) / len(latencies))
    print(f"Metrics.observe: {best * 1e9:.0f} ns per call (best of 200 rounds of {len(latencies)})")


if __name__ == "__main__":
    main()
