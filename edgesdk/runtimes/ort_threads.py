"""One intra-op thread for a model too small to share out: chosen by timing it when it loads.

onnxruntime splits each run over ``intra_op_num_threads`` threads (by default one per core).
For a model whose run takes tens of microseconds the split costs more than it saves: each run
wakes a sleeping worker (a futex wake, and on a VM an inter-processor interrupt) and waits for
it. Measured on the 2-core VM with the digits CNN: 85 µs per run and 122 µs of CPU with the
default two threads (spinning off), 56 µs and 56 µs of CPU with one (BENCHMARKS.md, issue 15);
and under load the worker's wake-up is delayed by whatever else runs, so the run gets slower
still. A large model is the other way round (MobileNetV2: 2.3x faster with both cores).

So when the agent leaves the thread count to the runtime (``runtime_threads`` unset), a
session whose first runs on zero inputs take under ``TINY_RUN_S`` is timed again with one
thread, and the faster of the two is kept. Anything that cannot be timed this way (an input
type numpy lacks, a run that fails on zeros, an accelerator provider) keeps the default.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

log = logging.getLogger("edgesdk.runtimes")

#: Runs slower than this (default threads) are left alone: the split pays for itself there.
TINY_RUN_S = 0.002
_WARMUP = 3
_TIMED = 9

_NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_,
}


def zero_feeds(session: Any) -> dict[str, np.ndarray] | None:
    """Zeros for every input (a symbolic or unknown dimension as 1); None when an input's type
    has no numpy dtype (sequences, maps, optional inputs)."""
    feeds: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        dtype = _NUMPY_TYPES.get(arg.type)
        if dtype is None:
            return None
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in arg.shape]
        feeds[arg.name] = np.zeros(shape, dtype)
    return feeds


def median_run_s(run: Callable[[Any, Any, Any], Any], names: list[str], feeds: dict[str, np.ndarray]) -> float:
    """Median seconds of ``run(names, feeds, None)`` after a warm-up; a run far over
    ``TINY_RUN_S`` is returned at once (one run of a large model is all this spends on it)."""
    start = time.perf_counter()
    run(names, feeds, None)
    first = time.perf_counter() - start
    if first > 25 * TINY_RUN_S:
        return first
    for _ in range(_WARMUP - 1):
        run(names, feeds, None)
    times = []
    for _ in range(_TIMED):
        start = time.perf_counter()
        run(names, feeds, None)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def choose(session: Any, run: Callable[[Any, Any, Any], Any], one_thread: Callable[[], Any]) -> tuple[Any, str]:
    """(the session to serve with, why): ``session`` (the runtime's default threads) or the one
    ``one_thread()`` makes, whichever ran the model faster here."""
    if usable_cpus() < 2:
        return session, "onnxruntime default (one core)"
    feeds = zero_feeds(session)
    if feeds is None:
        return session, "onnxruntime default (inputs zeros cannot stand in for)"
    names = [arg.name for arg in session.get_outputs()]
    try:
        default_s = median_run_s(run, names, feeds)
        if default_s >= TINY_RUN_S:
            return session, f"onnxruntime default ({default_s * 1e3:.1f} ms per run: large enough to share)"
        single = one_thread()
        single_s = median_run_s(_native_run(single), names, feeds)
    except Exception as exc:  # noqa: BLE001 - any failure here just keeps the runtime's default
        log.debug("intra-op threads left at onnxruntime's default: timing on zeros failed: %s", exc)
        return session, "onnxruntime default (the model did not run on zeros)"
    timing = f"{single_s * 1e6:.0f} µs per run with one thread, {default_s * 1e6:.0f} µs with the default"
    if single_s <= default_s:
        return single, f"1 ({timing})"
    return session, f"onnxruntime default ({timing})"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's cpuset, ``taskset``), not
    all the machine has."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _native_run(session: Any) -> Callable[[Any, Any, Any], Any]:
    native = getattr(session, "_sess", None)
    return native.run if native is not None and hasattr(native, "run") else session.run
