"""The NaN/Inf scan of float inputs, and the thread that runs it beside the model.

``all_finite`` is the scan itself (one BLAS pass). ``ScanThread`` lets the server scan a large
input while the model runs on it, instead of before: the read of a cold 602 KB input costs more
than the agent's whole overhead budget, and onnxruntime releases the GIL while it runs, so on a
device with a second core the scan is nearly free there. A request's result is returned only
once its scan finished, and a non-finite input is refused as if it had been scanned first.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

from edgesdk.errors import InferenceInputError

log = logging.getLogger("edgesdk.agent.nonfinite")


#: Requests refused for NaN/Inf, by input name, since the agent started (``ModelQuality.nonfinite``
#: reads it per model, agent/drift/). Refusals are rare: a lock costs nothing that matters.
REFUSED: Counter[str] = Counter()
_REFUSED_LOCK = threading.Lock()


def nonfinite_error(name: str) -> InferenceInputError:
    """The error for a float input holding NaN or Inf: the same whether scanned before or during the run.
    Every refusal makes one, so it is counted here."""
    with _REFUSED_LOCK:
        REFUSED[name] += 1
    return InferenceInputError(
        f"input {name!r}: contains NaN or Inf (refused: the agent's api.allow_nonfinite is false)"
    )


def first_nonfinite(inputs: Sequence[tuple[str, np.ndarray]]) -> str | None:
    """The name of the first (name, array) holding NaN or Inf; None when all are finite."""
    for name, array in inputs:
        if not all_finite(array):
            return name
    return None


_BLAS_FLOATS = (np.dtype("float32"), np.dtype("float64"))


def all_finite(array: np.ndarray) -> bool:
    """True when no element is NaN or ±Inf.

    Contiguous float32/64 arrays take one BLAS dot product first: if x·x is finite, every
    element is (a NaN or Inf anywhere makes it NaN or +Inf; the squares are never negative,
    so no Inf - Inf can cancel), in one read of the array and no temporary, where
    ``isfinite().all()`` builds a boolean array as big as the input (and is two numpy calls:
    1.4 µs against 0.6 µs for 64 floats). Only when the dot product is not finite (a real
    NaN/Inf, or huge finite values that overflow) is the exact check run, so a false
    "finite" is impossible.

    Why these calls: after a large model's run the caches are cold and every numpy entry
    point costs tens of µs on a small VM (measured: ``np.errstate`` ~30 µs, a ufunc on the
    0-d result ~5 µs). ``np.vdot`` is the same BLAS call as ``np.dot`` but does not raise
    numpy's floating-point warnings, so the overflow case needs no ``errstate``, and
    ``math.isfinite`` tests the scalar without a ufunc.
    """
    if array.dtype in _BLAS_FLOATS and array.flags.c_contiguous:
        if math.isfinite(np.vdot(array, array)):
            return True
    return bool(np.isfinite(array).all())


# The scan thread's handoff. Waking a thread that sleeps in the kernel costs the waker ~25 µs
# after a MobileNetV2 run on the 2-core VM (the idle vCPU has halted: the futex wake is an IPI
# through the hypervisor), as much as the scan it would save. So while requests come, the scan
# thread polls for jobs every SCAN_POLL_S instead (a request's handoff is then a deque append,
# no system call), and only after SCAN_IDLE_S without a job does it block until woken. The
# scan starts at most SCAN_POLL_S (plus the timer's slack) after the handoff: deferred inputs
# are >= 256 KiB, and models taking those run longer than that (MobileNetV2: 7 ms here); a
# request whose run was shorter takes its job back and scans it itself (``result``), as if it
# had not been deferred. Cost while polling: ~1000 wake-ups/s of a few µs each.
SCAN_POLL_S = 0.001
SCAN_IDLE_S = 0.1

# ``ScanJob.bad`` when the scan itself raised on the scan thread (MemoryError in the exact check).
_SCAN_FAILED = "\0scan failed"


class ScanJob:
    """One request's deferred NaN/Inf scan: ``bad`` is the first non-finite input's name (None:
    all finite), final once ``done`` is released. ``done`` is a lock used as a latch, created
    held and released by the scan thread: two C calls, where a ``threading.Event`` is Python
    code around a Condition (its ``wait`` allocates a lock too)."""

    __slots__ = ("inputs", "bad", "done")

    def __init__(self, inputs: Sequence[tuple[str, np.ndarray]]) -> None:
        self.inputs = inputs
        self.bad: str | None = None
        self.done = done = threading.Lock()
        done.acquire()


class ScanThread:
    """One long-lived daemon thread that NaN/Inf-scans large inputs while the requesting thread
    runs the model (onnxruntime releases the GIL while it runs, so the scan gets the other core).

    ``submit`` hands a job over (see SCAN_POLL_S for why a polled deque rather than a queue the
    thread blocks on) and ``result`` waits for its answer; the thread starts with the first job.
    A scan is never skipped, at worst it moves back to the request's own thread: ``submit``
    answers None when no thread can take work (a new thread is refused at interpreter shutdown),
    and ``result`` scans in the caller's thread a job the thread has not picked up yet, one
    whose scan failed there, and one the thread will never finish (gone after a fork, frozen at
    interpreter shutdown).
    """

    def __init__(self) -> None:
        self._jobs: collections.deque[ScanJob] = collections.deque()
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._idle = False  # True while the thread blocks on _wake: the next submit must wake it
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, inputs: Sequence[tuple[str, np.ndarray]]) -> ScanJob | None:
        """Hand a scan of ``inputs`` over; None when nothing can take it (the caller scans them)."""
        if self._thread is None and not self._start():
            return None
        job = ScanJob(inputs)
        self._jobs.append(job)
        if self._idle:  # the thread sleeps until woken (no job for SCAN_IDLE_S): wake it
            self._idle = False
            self._wake.put(None)
        return job

    def result(self, job: ScanJob) -> str | None:
        """Once ``job``'s scan is done: the name of its first input holding NaN/Inf, or None."""
        # Usually released long ago (the model ran for far longer than the scan): one C call.
        if not job.done.acquire(False):
            try:
                self._jobs.remove(job)  # not picked up yet: scanning it here is the quickest
            except ValueError:
                pass  # under way on the scan thread: wait below
            else:
                return first_nonfinite(job.inputs)
            # The timeout only matters if the thread will never finish it (a fork's child,
            # interpreter shutdown where daemon threads freeze): then scan it here.
            while not job.done.acquire(True, 0.5):
                thread = self._thread
                if thread is None or not thread.is_alive() or sys.is_finalizing():
                    return first_nonfinite(job.inputs)
        bad = job.bad
        return first_nonfinite(job.inputs) if bad is _SCAN_FAILED else bad

    def _start(self) -> bool:
        with self._start_lock:
            if self._thread is None:
                if sys.is_finalizing():
                    return False
                self._idle = False  # it starts polling
                thread = threading.Thread(target=self._serve, name="edgesdk-nan-scan", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # "can't create new thread at interpreter shutdown"
                    return False
                self._thread = thread
        return True

    def _serve(self) -> None:
        jobs, wake = self._jobs, self._wake
        last_job = time.monotonic()
        while True:
            if jobs:
                try:
                    job = jobs.popleft()
                except IndexError:  # its request took it back in the meantime
                    continue
                try:
                    job.bad = first_nonfinite(job.inputs)
                except Exception:  # noqa: BLE001 - the request's own thread redoes the scan and gets the error
                    log.debug("deferred non-finite scan failed; the request's thread repeats it", exc_info=True)
                    job.bad = _SCAN_FAILED
                job.done.release()
                last_job = time.monotonic()
            elif time.monotonic() - last_job < SCAN_IDLE_S:
                time.sleep(SCAN_POLL_S)
            else:
                # Flag first, look again, then block: a job appended before a submit could see
                # the flag is found by the second look, one appended after it comes with a wake.
                # (A wake that finds the thread already up only costs one extra idle period.)
                self._idle = True
                if not jobs:
                    wake.get()
                self._idle = False
                last_job = time.monotonic()

    def _after_fork(self) -> None:
        """In a forked child the thread is gone and a lock may be held: start afresh."""
        self._jobs = collections.deque()
        self._wake = queue.SimpleQueue()
        self._idle = False
        self._thread = None
        self._start_lock = threading.Lock()


_SHARED_SCAN_THREAD = ScanThread()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SHARED_SCAN_THREAD._after_fork)


def shared_scan_thread() -> ScanThread:
    """The process's one ScanThread. The agent serves one model, and tests build many servers:
    a thread per server would leave an idle thread behind for each."""
    return _SHARED_SCAN_THREAD
