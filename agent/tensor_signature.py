"""A model's public input/output tensor signature (names, dtypes, shapes), and checking requests against it.

Every variant of a model (fp32 ONNX, int8 TFLite, ...) is served behind ONE public
signature so that a precision switch is invisible to clients: float inputs stay float even
when the active variant is full-int8 (the server quantizes on the way in and dequantizes on
the way out), and a dimension any variant fixes is fixed for all. Checks are precomputed per
input so the hot path is a handful of comparisons. The NaN/Inf scan of large float inputs is
the one check the server may run concurrently with the model (``edgesdk.agent.nonfinite``);
``check`` on its own always does all of them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from edgesdk.agent.nonfinite import all_finite, nonfinite_error

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
# Only where the run leaves a core idle (an accelerator runs it, or fewer runtime threads than
# cores: ``LoadedModel.cores_free_while_running``): where the runtime's threads take every core
# (onnxruntime's default) the scan thread preempts one of them, and its polling (SCAN_POLL_S)
# does so ~10 times per MobileNetV2 answer: measured with wrk at c=1, 13 involuntary context
# switches per answer against 2.6 with the scan before the run, and in process ~2-4 % more CPU
# per call for no gain in latency (BENCHMARKS.md, issue 15, eighth session).
DEFERRED_SCAN_MIN_BYTES = 256 * 1024
#: Shapes remembered per input as having passed the shape check (batch sizes, lengths).
_PASSED_SHAPES_MAX = 64


@dataclass(frozen=True)
class TensorSlot:
    """One public tensor: name, dtype, shape (int = fixed; str/None = any size)."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | str | None, ...]

    @functools.cached_property
    def fixed_axes(self) -> tuple[tuple[int, int], ...]:
        # Cached: the request path checks every declared shape against it.
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
        # (name, dtype, rank, fixed axes, is_float, exact shape or None, shapes that passed):
        # precomputed for the hot path. A fully fixed, non-empty shape is checked with one tuple
        # comparison; a shape with a dynamic axis (the batch) with one set lookup once it passed.
        self._checks: list[
            tuple[str, np.dtype[Any], int, tuple[tuple[int, int], ...], bool, Any, set[tuple[int, ...]]]
        ] = [
            (
                s.name,
                s.dtype,
                len(s.shape),
                s.fixed_axes,
                s.dtype.kind == "f",
                s.shape if len(s.fixed_axes) == len(s.shape) and all(s.shape) else None,
                set(),
            )
            for s in self.inputs
        ]
        #: (input name, declared shape) → its size in bytes, for shapes an encoding declared that
        #: passed ``codec.check_declared`` (bounded: shapes are the clients' to choose).
        self.declared_nbytes: dict[tuple[str, tuple[int, ...]], int] = {}

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
        for name, dtype, rank, fixed, is_float, exact, passed in self._checks:
            array = feeds.get(name)
            if array is None:
                raise self._names_error(feeds)
            # Builtin dtypes are singletons: the identity test settles the usual case cheaply.
            if array.dtype is not dtype and array.dtype != dtype:
                raise InferenceInputError(f"input {name!r}: dtype {_label(array.dtype)}, expected {dtype.name}")
            shape = array.shape
            # A fully fixed, non-empty shape needs nothing else compared; nor one that passed.
            if shape != exact and shape not in passed:
                self._check_shape(name, array, rank, fixed)
                if len(passed) < _PASSED_SHAPES_MAX:
                    passed.add(shape)
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
        expected = [check[0] for check in self._checks]
        missing = [n for n in expected if n not in feeds]
        unknown = [n for n in feeds if n not in self.by_name]
        parts = []
        if missing:
            parts.append(f"missing input(s) {missing}")
        if unknown:
            parts.append(f"unknown input(s) {unknown}")
        return InferenceInputError(f"{'; '.join(parts) or 'inputs do not match'}; the model takes {expected}")


def _label(dtype: np.dtype[Any]) -> str:
    """The dtype's name, with its byte order when that is what differs (">f4" vs float32)."""
    return dtype.name if dtype.isnative else f"{dtype.name} ({dtype.str}, non-native byte order)"


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
