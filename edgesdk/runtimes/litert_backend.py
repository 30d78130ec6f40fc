"""LiteRT backend: the only module of the agent that imports ai-edge-litert (or tflite-runtime).

Models run through their default signature, so tensors are named as the converter named
them ("image", "logits") rather than by the interpreter's internal tensor names. A model
without a signature (as MediaPipe ships them) runs by tensor index, its tensors named by the
interpreter's tensor names. Full-int8
models take and return int8: the TensorSpecs carry the quantization parameters and callers
quantize/dequantize with them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from edgesdk.errors import InferenceInputError, RuntimeBackendError
from edgesdk.runtimes.execution import (
    LITERT_CPU,
    ExecutionReport,
    ExecutionRequest,
    litert_report,
    open_litert_delegates,
)
from edgesdk.runtimes.native_messages import one_line
from edgesdk.runtimes.sequence_buckets import is_bucket, pad
from edgesdk.schemas.manifest import QuantParams, TensorSpec


def _interpreter_module() -> Any:
    try:
        import ai_edge_litert.interpreter as module
    except ImportError:
        # Old devices: tflite-runtime is the predecessor with the same Interpreter API.
        import tflite_runtime.interpreter as module  # type: ignore[no-redef]
    return module


def _interpreter_class() -> Any:
    return _interpreter_module().Interpreter


#: What LiteRT's C++ logger writes straight to file descriptor 2 as an interpreter allocates
#: its tensors, on every load: nothing a user can act on. TF_CPP_MIN_LOG_LEVEL does not reach
#: this logger (measured: ai-edge-litert 2.3.0 prints it at level 3 too), nor does any other
#: variable, and its setter is not exported; so the line is taken out of fd 2 around the call.
_CHATTER = (b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",)
_FD2_LOCK = threading.Lock()  # two loads at once must not swap fd 2 under each other


@contextlib.contextmanager
def _without_chatter() -> Iterator[None]:
    """Catch fd 2 for the block and write back every line but :data:`_CHATTER`: LiteRT's real
    errors, and whatever other threads logged meanwhile, still reach stderr (just after the block).

    fd 2 goes to a pipe drained by a thread, not to a temporary file: a model is being loaded, and
    nothing on that path may write a file (tests/integration/test_bundle_in_memory.py traces it)."""
    with _FD2_LOCK:
        sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no fd 2 at all (a daemon started with it closed): nothing to keep clean
            yield
            return
        read_end, write_end = os.pipe()
        caught: list[bytes] = []
        drain = threading.Thread(target=_drain, args=(read_end, caught), name="litert-stderr", daemon=True)
        drain.start()
        os.dup2(write_end, 2)
        os.close(write_end)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)  # closes the pipe's last write end: the drain reads to its end
            os.close(saved)
            drain.join(timeout=5.0)  # a child that inherited fd 2 could hold the pipe open
            lines = b"".join(caught).splitlines(keepends=True)
            kept = b"".join(line for line in lines if line.rstrip(b"\r\n") not in _CHATTER)
            while kept:
                kept = kept[os.write(2, kept) :]


def _drain(fd: int, into: list[bytes]) -> None:
    """Read ``fd`` to its end into ``into``, then close it."""
    try:
        while chunk := os.read(fd, 65536):
            into.append(chunk)
    finally:
        os.close(fd)


def _spec(name: str, detail: Mapping[str, Any]) -> TensorSpec:
    shape = [int(d) if d >= 0 else None for d in detail.get("shape_signature", detail["shape"])]
    quantization = None
    params = detail.get("quantization_parameters") or {}
    scales = list(np.asarray(params.get("scales", []), dtype=np.float64))
    if scales:
        zero_points = [int(z) for z in np.asarray(params.get("zero_points", []))]
        axis = int(params.get("quantized_dimension", 0)) if len(scales) > 1 else None
        quantization = QuantParams(scale=[float(s) for s in scales], zero_point=zero_points, axis=axis)
    return TensorSpec(name=name, dtype=np.dtype(detail["dtype"]).name, shape=shape, quantization=quantization)


def _kernel_choice(module: Any, model: bytes) -> dict[str, Any]:
    """The interpreter's op resolver: LiteRT's builtin kernels without its default XNNPACK
    delegate for a quantized model whose inputs can change shape, else the default.

    Measured (issue 38, ai-edge-litert 2.3, basic-pitch's nmp.tflite quantized to int8): with
    XNNPACK, an interpreter resized to another batch after it has run gives one of two answers
    for the same bytes and inputs (contour cosine 0.989508 or 0.933721 for the dynamic int8; the
    full-integer int8 sometimes stops in DIV, "data[i] != zero_point"), depending on the state of
    the process; the builtin kernels gave one answer every time (0.989142), and float models
    stayed exact with XNNPACK. Validation and the agent both load here: the device runs the
    kernels that were validated."""
    resolvers = getattr(module, "OpResolverType", None)
    if resolvers is None:
        return {}
    without = {"experimental_op_resolver_type": resolvers.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    probe = module.Interpreter(model_content=model, **without)  # reads the graph; allocates nothing
    resizable = any(-1 in list(d.get("shape_signature", ())) for d in probe.get_input_details())
    quantized = any(np.dtype(d["dtype"]) in (np.int8, np.uint8) for d in probe.get_tensor_details())
    return without if resizable and quantized else {}


class _TensorIndexRunner:
    """A signature runner's interface over a .tflite without a SignatureDef (MediaPipe ships
    every model so): the subgraph's inputs and outputs by their tensor names, run by index."""

    def __init__(self, interpreter: Any) -> None:
        self._interpreter = interpreter
        self._inputs = {d["name"]: d for d in interpreter.get_input_details()}
        self._outputs = {d["name"]: d for d in interpreter.get_output_details()}
        self._shapes = {name: [int(n) for n in d["shape"]] for name, d in self._inputs.items()}
        if len(self._inputs) != len(interpreter.get_input_details()) or len(self._outputs) != len(
            interpreter.get_output_details()
        ):
            raise RuntimeBackendError(
                "the .tflite model has no signature and two of its inputs or outputs share a name"
            )

    def get_input_details(self) -> dict[str, Any]:
        return dict(self._inputs)

    def get_output_details(self) -> dict[str, Any]:
        return dict(self._outputs)

    def __call__(self, **feeds: np.ndarray) -> dict[str, np.ndarray]:
        interpreter = self._interpreter
        resized = False
        for name, value in feeds.items():
            shape = list(np.shape(value))
            if shape != self._shapes[name]:  # a dynamic axis (-1 in shape_signature) took another size
                interpreter.resize_tensor_input(self._inputs[name]["index"], shape, strict=True)
                self._shapes[name] = shape
                resized = True
        if resized:
            interpreter.allocate_tensors()
        for name, value in feeds.items():
            interpreter.set_tensor(self._inputs[name]["index"], value)
        interpreter.invoke()
        return {name: interpreter.get_tensor(d["index"]) for name, d in self._outputs.items()}


def _serving_runner(interpreter: Any, signatures: Mapping[str, Any]) -> tuple[str | None, Any]:
    """The serving signature's runner, or the tensor-index runner when the model has none."""
    serving = [key for key in signatures if not is_bucket(key)]
    if serving:
        return serving[0], interpreter.get_signature_runner(serving[0])
    if signatures:
        raise RuntimeBackendError("the .tflite model has only sequence-bucket signatures and no serving one")
    return None, _TensorIndexRunner(interpreter)


class LiteRTModel:
    """An interpreter built from bytes. Interpreters are not re-entrant, so ``run`` takes a lock."""

    thread_safe = False
    cores_free_while_running = False  # not known here (delegates, XNNPACK's own threads): scan before the run
    execution: ExecutionReport | None = None  # the delegate it runs with (set by the backend)

    def __init__(
        self, interpreter: Any, model: bytes, delegates: list[Any] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        self._model = model  # the interpreter reads the buffer in place: keep it alive
        self._delegates = delegates or []  # and uses its delegates: keep them alive with it
        self._options = options or {}  # how the interpreter was made (threads, kernels): for with_fresh_state
        self._interpreter = interpreter
        self._lock = threading.Lock()
        signatures = interpreter.get_signature_list()
        self._signature, self._runner = _serving_runner(interpreter, signatures)
        # Signatures list names alphabetically; tensor indices keep the model's own order.
        by_index = lambda item: item[1]["index"]  # noqa: E731
        self.inputs = [_spec(n, d) for n, d in sorted(self._runner.get_input_details().items(), key=by_index)]
        self.outputs = [_spec(n, d) for n, d in sorted(self._runner.get_output_details().items(), key=by_index)]
        #: Sequence buckets (sequence_buckets.py): input → its sequence axis, and (length, runner)
        #: from the shortest bucket to the serving signature's length. Empty: one static shape.
        self.sequence_axes: dict[str, int] = {}
        self._buckets: list[tuple[int, Any]] = []
        buckets = [key for key in signatures if is_bucket(key)]
        if buckets:
            self._read_buckets(interpreter, buckets)

    def _read_buckets(self, interpreter: Any, keys: list[str]) -> None:
        """The axes where the bucket signatures' inputs differ from the serving one's are the
        sequence axes; the inputs' specs leave them open (None)."""
        full = {s.name: s.shape for s in self.inputs}
        runners = []
        for key in keys:
            runner = interpreter.get_signature_runner(key)
            shapes = {n: list(d["shape"]) for n, d in runner.get_input_details().items()}
            if set(shapes) != set(full):
                raise RuntimeBackendError(f"bucket signature {key!r} has inputs {sorted(shapes)}, not {sorted(full)}")
            for name, shape in shapes.items():
                differ = [axis for axis, (a, b) in enumerate(zip(shape, full[name])) if a != b]
                if len(shape) != len(full[name]) or len(differ) > 1:
                    raise RuntimeBackendError(f"bucket signature {key!r}: input {name!r} {shape} vs {full[name]}")
                if differ:
                    self.sequence_axes[name] = differ[0]
            runners.append((key, runner, shapes))
        if not self.sequence_axes:
            return
        name, axis = next(iter(self.sequence_axes.items()))
        longest = int(full[name][axis] or 0)
        self._buckets = sorted((int(shapes[name][axis]), runner) for _, runner, shapes in runners)
        self._buckets.append((longest, self._runner))
        self.inputs = [
            s.model_copy(
                update={"shape": [None if i == self.sequence_axes.get(s.name) else d for i, d in enumerate(s.shape)]}
            )
            for s in self.inputs
        ]

    @property
    def bucket_lengths(self) -> list[int]:
        return [length for length, _ in self._buckets]

    def _bucketed(self, feeds: Mapping[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]]:
        """The runner of the shortest bucket that holds the request, and its feeds padded to it."""
        lengths = {np.shape(feeds[n])[axis] for n, axis in self.sequence_axes.items() if n in feeds}
        if len(lengths) != 1:
            raise InferenceInputError(
                f"inputs {sorted(self.sequence_axes)} must have one sequence length; got {sorted(lengths)}"
            )
        (length,) = lengths
        for bucket, runner in self._buckets:
            if length <= bucket:
                padded = {
                    n: pad(np.asarray(v), self.sequence_axes[n], bucket) if n in self.sequence_axes else v
                    for n, v in feeds.items()
                }
                return runner, padded
        raise InferenceInputError(
            f"a sequence of {length} is longer than this model's longest ({self._buckets[-1][0]})"
        )

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = {s.name: s for s in self.inputs}
        missing = sorted(set(expected) - set(feeds))
        unknown = sorted(set(feeds) - set(expected))
        if missing or unknown:
            raise InferenceInputError(
                f"LiteRT model inputs are {sorted(expected)}; missing {missing}, unknown {unknown}"
            )
        for name, value in feeds.items():
            spec = expected[name]
            if np.asarray(value).dtype.name != spec.dtype:
                raise InferenceInputError(f"input {name!r} must be {spec.dtype}, got {np.asarray(value).dtype.name}")
            want = [d for d in spec.shape]
            got = list(np.shape(value))
            if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
                raise InferenceInputError(f"input {name!r} must have shape {want}, got {got}")
        runner = self._runner
        if self._buckets:
            runner, feeds = self._bucketed(feeds)
        with self._lock:
            if self._runner is None:
                raise RuntimeBackendError("the LiteRT model was closed")
            try:
                out = runner(**{k: np.asarray(v, order="C") for k, v in feeds.items()})  # 0-d stays 0-d
            except (ValueError, RuntimeError) as exc:
                raise RuntimeBackendError(f"LiteRT failed: {one_line(str(exc))}") from exc
        return {name: np.array(value) for name, value in out.items()}

    def with_fresh_state(self) -> LiteRTModel:
        """Another interpreter on the same bytes, kernels and delegates, at the model's initial
        state: a streaming model keeps its state in TFLite resource variables (VAR_HANDLE, set
        once by CALL_ONCE), which ``reset_all_variables`` does not touch (it zeroes only
        ``is_variable`` tensors; on okay_nabu its answers after a reset differ from a fresh
        interpreter's) and which the Python API cannot write (tensor details list only the
        copies READ_VARIABLE makes), so no snapshot of them can be put back either. 0.9 ms for okay_nabu, mostly allocate_tensors (XNNPACK);
        pymicro-wakeword's own fresh detector per WAV takes 1.1 ms (2026-12-06)."""
        module = _interpreter_module()
        with _without_chatter():
            try:
                interpreter = module.Interpreter(
                    model_content=self._model, experimental_delegates=self._delegates or None, **self._options
                )
                interpreter.allocate_tensors()
            except (ValueError, RuntimeError) as exc:
                raise RuntimeBackendError(f"LiteRT could not restart the model: {one_line(str(exc))}") from exc
            fresh = LiteRTModel(interpreter, self._model, self._delegates, self._options)
        fresh.execution = self.execution
        return fresh

    def close(self) -> None:
        with self._lock:
            self._runner = None
            self._buckets = []
            self._interpreter = None
            self._delegates = []


class LiteRTBackend:
    """ai-edge-litert (fallback: tflite-runtime), loading ``.tflite`` bytes."""

    name = "litert"

    def is_available(self) -> bool:
        try:
            _interpreter_class()
        except ImportError:
            return False
        return True

    def load(
        self,
        model: bytes,
        *,
        weights: bytes | None = None,
        options: Mapping[str, str] | None = None,
        execution: ExecutionRequest | None = None,
    ) -> LiteRTModel:
        if weights is not None:
            raise RuntimeBackendError("LiteRT loads a single .tflite file (no separate weights)")
        opts = dict(options or {})
        threads = opts.get("num_threads")
        model = bytes(model)  # Interpreter(model_content=...) needs immutable bytes
        module = _interpreter_module()
        request = execution or ExecutionRequest()
        delegates, using, skipped = open_litert_delegates(request, getattr(module, "load_delegate", None))
        num_threads = int(threads) if threads is not None else None
        with _without_chatter():
            try:
                kernels = _kernel_choice(module, model) if not delegates else {}
                try:
                    interpreter = module.Interpreter(
                        model_content=model,
                        num_threads=num_threads,
                        experimental_delegates=delegates or None,
                        **kernels,
                    )
                    interpreter.allocate_tensors()
                except (ValueError, RuntimeError) as exc:
                    if not delegates:
                        raise
                    # The delegate loaded but does not take this model (not compiled for the Edge TPU...).
                    skipped[using[0]] = f"the interpreter did not start with it: {one_line(str(exc))[:200]}"
                    delegates, using = [], (LITERT_CPU,)
                    kernels = _kernel_choice(module, model)
                    interpreter = module.Interpreter(model_content=model, num_threads=num_threads, **kernels)
                    interpreter.allocate_tensors()
            except (ValueError, RuntimeError) as exc:
                raise RuntimeBackendError(f"LiteRT could not load the model: {one_line(str(exc))}") from exc
            # Its signature runners (one per sequence bucket) allocate too.
            loaded = LiteRTModel(interpreter, model, delegates, {"num_threads": num_threads, **kernels})
        loaded.execution = litert_report(request, using, skipped)
        return loaded
