"""A model's public input/output signature, and checking requests against it.

Every variant of a model (fp32 ONNX, int8 TFLite, ...) is served behind ONE public
signature so that a precision switch is invisible to clients: float inputs stay float even
when the active variant is full-int8 (the server quantizes on the way in and dequantizes on
the way out), and a dimension any variant fixes is fixed for all. Checks are precomputed per
input so the hot path is a handful of comparisons. The NaN/Inf scan of large float inputs is
the one check the server may run concurrently with the model (``ScanThread``); ``check`` on
its own always does all of them.
"""

from __future__ import annotations

import collections
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgesdk.errors import InferenceInputError
from edgesdk.schemas.manifest import TensorSpec

# Float inputs of at least this many bytes are NaN/Inf-scanned by the server WHILE the model
# runs (on the ScanThread, see ``Signature.check_deferring_scans``) instead of before it. Why:
# the scan reads the whole input, cold in the caches after the model's previous run: 45-60 µs
# for MobileNetV2's 602 KB on the 2-core VM, more than the agent's whole overhead budget (20 µs).
# The handoff is not free either: ~13 µs after a MobileNetV2 run (the job, its latch, the wait,
# all with cold caches), where a small input costs less to scan in place (digits: 256 bytes,
# ~1 µs). A cold read runs at ~10-20 GB/s here, so the two break even near 130-260 KB: at
# 256 KiB and up deferring clearly wins, and everything smaller keeps the simpler in-line path.
DEFERRED_SCAN_MIN_BYTES = 256 * 1024


@dataclass(frozen=True)
class TensorSlot:
    """One public tensor: name, dtype, shape (int = fixed; str/None = any size)."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | str | None, ...]

    @property
    def fixed_axes(self) -> tuple[tuple[int, int], ...]:
        return tuple((axis, dim) for axis, dim in enumerate(self.shape) if isinstance(dim, int))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape)}


def public_dtype(spec: TensorSpec) -> np.dtype[Any]:
    """Quantized tensors are float32 to clients; others keep their dtype."""
    return np.dtype("float32") if spec.quantization is not None else np.dtype(spec.dtype)


def merge_shapes(shapes: Sequence[Sequence[int | str | None]]) -> tuple[int | str | None, ...]:
    """Per axis: the first variant's fixed size if any variant fixes it, else its dynamic name."""
    first = list(shapes[0])
    merged: list[int | str | None] = []
    for axis, dim in enumerate(first):
        if isinstance(dim, int):
            merged.append(dim)
            continue
        fixed = next(
            (s[axis] for s in shapes[1:] if len(s) == len(first) and isinstance(s[axis], int)),
            None,
        )
        merged.append(fixed if fixed is not None else dim)
    return tuple(merged)


class Signature:
    """Public inputs/outputs of a served model, with a fast ``check``."""

    def __init__(self, inputs: Sequence[TensorSlot], outputs: Sequence[TensorSlot], *, allow_nonfinite: bool) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.allow_nonfinite = allow_nonfinite
        self.by_name = {slot.name: slot for slot in self.inputs}
        # (name, dtype, rank, fixed axes, is_float, exact shape or None): precomputed for the hot
        # path. A fully fixed, non-empty shape is checked with one tuple comparison.
        self._checks = [
            (
                s.name,
                s.dtype,
                len(s.shape),
                s.fixed_axes,
                s.dtype.kind == "f",
                s.shape if len(s.fixed_axes) == len(s.shape) and all(s.shape) else None,
            )
            for s in self.inputs
        ]

    @classmethod
    def from_specs(
        cls,
        variant_specs: Sequence[tuple[Sequence[TensorSpec], Sequence[TensorSpec]]],
        *,
        allow_nonfinite: bool = False,
    ) -> Signature:
        """Build from each variant's (inputs, outputs), best variant first."""
        top_inputs, top_outputs = variant_specs[0]

        def slots(top: Sequence[TensorSpec], pick: int) -> list[TensorSlot]:
            result = []
            for spec in top:
                shapes = [spec.shape] + [
                    other.shape for specs in variant_specs[1:] for other in specs[pick] if other.name == spec.name
                ]
                result.append(TensorSlot(spec.name, public_dtype(spec), merge_shapes(shapes)))
            return result

        return cls(slots(top_inputs, 0), slots(top_outputs, 1), allow_nonfinite=allow_nonfinite)

    def describe(self) -> dict[str, Any]:
        return {"inputs": [s.describe() for s in self.inputs], "outputs": [s.describe() for s in self.outputs]}

    def check(self, feeds: Mapping[str, np.ndarray]) -> None:
        """InferenceInputError naming the first problem: missing/unknown name, dtype, shape, NaN.

        Complete: every check, the NaN/Inf scan of every float input included, is done when it
        returns. (The server uses ``check_deferring_scans`` to overlap the large scans with the
        model's run; anything else that validates feeds should call this.)
        """
        self.check_deferring_scans(feeds, min_bytes=math.inf)  # nothing is that large: nothing deferred

    def check_deferring_scans(
        self, feeds: Mapping[str, np.ndarray], min_bytes: float = DEFERRED_SCAN_MIN_BYTES
    ) -> list[tuple[str, np.ndarray]] | None:
        """``check``, except the NaN/Inf scan of float inputs of ``min_bytes`` or more: those are
        returned as (name, array) (None when there are none), and the caller must scan them
        (``first_nonfinite``, or a ``ScanThread`` job) and refuse the request (``nonfinite_error``)
        before it uses anything computed from them. Names, dtypes, shapes and the small inputs'
        scans are all checked here, so a malformed request never reaches the model. (With several
        bad inputs, the error named first may differ from ``check``'s: deferred scans come last.)

        Why split: the scan of a large input costs more than the rest of the agent's overhead;
        the server runs it on another core while the model runs (the runtime releases the GIL)
        rather than before. One method with the threshold as a parameter keeps ``check`` and the
        server's path one code path, and the server's hot path one call, as before. (``min_bytes``
        is not keyword-only: a keyword-only default is slower to call, and this is the hot path.)
        """
        if len(feeds) != len(self._checks):
            raise self._names_error(feeds)
        deferred: list[tuple[str, np.ndarray]] | None = None  # no list to build in the usual case
        for name, dtype, rank, fixed, is_float, exact in self._checks:
            array = feeds.get(name)
            if array is None:
                raise self._names_error(feeds)
            # Builtin dtypes are singletons: the identity test settles the usual case cheaply.
            if array.dtype is not dtype and array.dtype != dtype:
                raise InferenceInputError(f"input {name!r}: dtype {_label(array.dtype)}, expected {dtype.name}")
            if array.shape != exact:  # a fully fixed, non-empty shape needs nothing else compared
                self._check_shape(name, array, rank, fixed)
            if is_float and not self.allow_nonfinite:
                if array.nbytes >= min_bytes:
                    if deferred is None:
                        deferred = []
                    deferred.append((name, array))
                elif not all_finite(array):
                    raise nonfinite_error(name)
        return deferred

    def _check_shape(self, name: str, array: np.ndarray, rank: int, fixed: tuple[tuple[int, int], ...]) -> None:
        """Rank, every fixed axis, not empty: InferenceInputError naming the first mismatch."""
        shape = array.shape
        if len(shape) != rank:
            raise InferenceInputError(
                f"input {name!r}: shape {list(shape)} has rank {len(shape)}, expected rank {rank} "
                f"{list(self.by_name[name].shape)}"
            )
        for axis, size in fixed:
            if shape[axis] != size:
                raise InferenceInputError(
                    f"input {name!r}: shape {list(shape)} does not match {list(self.by_name[name].shape)} "
                    f"(axis {axis} must be {size})"
                )
        if array.size == 0:
            raise InferenceInputError(f"input {name!r}: shape {list(shape)} is empty")

    def _names_error(self, feeds: Mapping[str, np.ndarray]) -> InferenceInputError:
        expected = [name for name, *_ in self._checks]
        missing = [n for n in expected if n not in feeds]
        unknown = [n for n in feeds if n not in self.by_name]
        parts = []
        if missing:
            parts.append(f"missing input(s) {missing}")
        if unknown:
            parts.append(f"unknown input(s) {unknown}")
        return InferenceInputError(f"{'; '.join(parts) or 'inputs do not match'}; the model takes {expected}")


def nonfinite_error(name: str) -> InferenceInputError:
    """The error for a float input holding NaN or Inf: the same whether scanned before or during the run."""
    return InferenceInputError(f"input {name!r}: contains NaN or Inf (not accepted by this agent)")


def first_nonfinite(inputs: Sequence[tuple[str, np.ndarray]]) -> str | None:
    """The name of the first (name, array) holding NaN or Inf; None when all are finite."""
    for name, array in inputs:
        if not all_finite(array):
            return name
    return None


def _label(dtype: np.dtype[Any]) -> str:
    """The dtype's name, with its byte order when that is what differs (">f4" vs float32)."""
    return dtype.name if dtype.isnative else f"{dtype.name} ({dtype.str}, non-native byte order)"


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


def quantize(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """float → the quantized dtype of ``spec`` (real = scale * (q - zero_point))."""
    q = spec.quantization
    if q is None:
        return array
    dtype = np.dtype(spec.dtype)
    scale, zero = _broadcast(q.scale, q.zero_point, q.axis, array.ndim)
    info = np.iinfo(dtype)
    return np.clip(np.rint(array / scale) + zero, info.min, info.max).astype(dtype)


def dequantize(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """The quantized output of ``spec`` → float32."""
    q = spec.quantization
    if q is None:
        return array
    scale, zero = _broadcast(q.scale, q.zero_point, q.axis, array.ndim)
    return ((array.astype(np.float32) - zero) * scale).astype(np.float32)


def _broadcast(scale: list[float], zero: list[int], axis: int | None, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scale, dtype=np.float32)
    z = np.asarray(zero, dtype=np.float32)
    if axis is None or s.size == 1:
        return s.reshape(()) if s.size == 1 else s, z.reshape(()) if z.size == 1 else z
    shape = [1] * ndim
    shape[axis] = -1
    return s.reshape(shape), z.reshape(shape)
