"""onnxruntime backend: the only module of the agent that imports onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgesdk.errors import InferenceInputError, RuntimeBackendError
from edgesdk.runtimes import ort_threads
from edgesdk.runtimes.execution import ORT_CPU, ExecutionReport, ExecutionRequest, choose_ort_providers, ort_report
from edgesdk.schemas.manifest import TensorSpec

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
}


def _spec(arg: Any) -> TensorSpec:
    """onnxruntime NodeArg → TensorSpec (symbolic dims keep their names, unknown ones are None)."""
    shape = [d if isinstance(d, (int, str)) else None for d in arg.shape]
    return TensorSpec(name=arg.name, dtype=_ORT_TYPES.get(arg.type, "float32"), shape=shape)


class OnnxRuntimeModel:
    """An ``InferenceSession`` created from bytes. ORT sessions are safe to run concurrently."""

    thread_safe = True
    cores_free_while_running = False  # set by the backend (see _cores_free)
    execution: ExecutionReport | None = None  # the providers the session runs on (set by the backend)
    threads: str = "onnxruntime default"  # intra-op threads and why (set by the backend; see ort_threads)

    def __init__(self, session: object) -> None:
        self._session = session
        self.inputs = [_spec(a) for a in session.get_inputs()]  # type: ignore[attr-defined]
        self.outputs = [_spec(a) for a in session.get_outputs()]  # type: ignore[attr-defined]
        self._output_names = [o.name for o in self.outputs]
        import onnxruntime as ort  # loaded already: it made the session

        # Looked up once: every statement of ``run`` costs µs when a large model's run has just
        # evicted the interpreter from the caches (measured on MobileNetV2).
        self._input_errors = (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ValueError)
        self._run = _session_run(session)
        self._required_inputs = [
            a.name
            for a in session.get_inputs()  # type: ignore[attr-defined]
            if not a.type.startswith("optional")
        ]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            values = self._run(self._output_names, feeds if type(feeds) is dict else dict(feeds), None)
        except self._input_errors as exc:
            raise InferenceInputError(f"onnxruntime rejected the input: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - the runtime's own errors have no common base
            # The native call does not check for missing inputs first (see _session_run): a
            # failure with one missing is the caller's input error, as the public run says.
            missing = [name for name in self._required_inputs if name not in feeds]
            if missing:
                raise InferenceInputError(f"onnxruntime: required input(s) {missing} missing") from exc
            raise RuntimeBackendError(f"onnxruntime failed: {exc}") from exc
        return dict(zip(self._output_names, values, strict=True))

    def close(self) -> None:
        self._session = None


def _session_run(session: Any) -> Any:
    """The session's run function. ``InferenceSession.run`` first re-validates every call in
    Python (required input names, OrtValue ownership, WebGPU graph capture: several calls into
    the C++ side, ~2 µs, as much as the agent's own checks of a tiny model's request), then calls
    the native session. Where the session runs on the CPU provider alone, none of that can apply
    to what the agent passes (numpy arrays it has checked against the model's signature; no
    graph capture; no provider to fall back from), so it calls the native session directly.
    Any other provider list, or an onnxruntime without that attribute, keeps the public method."""
    native = getattr(session, "_sess", None)
    if native is not None and hasattr(native, "run") and session.get_providers() == ["CPUExecutionProvider"]:
        return native.run
    return session.run


def _cores_free(session: Any) -> bool:
    """Whether a run of ``session`` leaves a CPU core idle: it runs on an accelerator (the
    calling thread waits), or on fewer intra-op threads than the CPUs this process may use.
    With its default (0: one thread per physical core) onnxruntime's workers take every core
    for the run, and anything else the process does then preempts one of them."""
    if session.get_providers()[0] != ORT_CPU:
        return True
    threads = session.get_session_options().intra_op_num_threads
    return 0 < threads < ort_threads.usable_cpus()


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def is_available(self) -> bool:
        try:
            import onnxruntime  # noqa: F401
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
    ) -> OnnxRuntimeModel:
        import onnxruntime as ort

        if weights is not None:
            raise RuntimeBackendError("onnxruntime loads self-contained models only (no external weights)")
        opts = dict(options or {})
        session_options = ort.SessionOptions()
        threads = opts.pop("intra_op_num_threads", None)
        if threads is not None and threads != "auto":
            session_options.intra_op_num_threads = int(threads)
        spinning = opts.pop("allow_spinning", None)
        if spinning is not None:
            # Intra-op workers busy-wait after each run for the next one; on a small CPU that
            # spin takes the core the event loop (or the client) needs (BENCHMARKS.md, issue 15).
            session_options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning == "1" else "0")
        listed = opts.pop("providers", "")  # the older way to ask: a comma-separated option
        request = execution or ExecutionRequest.of(listed.split(","))
        providers, skipped = choose_ort_providers(request, ort.get_available_providers())
        try:
            # Bytes in, no file: the plaintext never touches disk.
            session = ort.InferenceSession(model, sess_options=session_options, providers=providers)
        except Exception as exc:  # noqa: BLE001
            if providers == [ORT_CPU]:
                raise RuntimeBackendError(f"onnxruntime could not load the model: {exc}") from exc
            # An accelerator provider that fails on this model (an op TensorRT cannot build): CPU.
            skipped[providers[0]] = f"the session did not start on it: {str(exc).splitlines()[0][:200]}"
            try:
                session = ort.InferenceSession(model, sess_options=session_options, providers=[ORT_CPU])
            except Exception as cpu_exc:  # noqa: BLE001
                raise RuntimeBackendError(f"onnxruntime could not load the model: {cpu_exc}") from cpu_exc
        threads_note = "onnxruntime default" if threads is None else threads
        if threads == "auto" and session.get_providers() == [ORT_CPU]:
            # One thread when that runs this model faster here (a tiny model): ort_threads.py.
            def one_thread() -> Any:
                session_options.intra_op_num_threads = 1
                return ort.InferenceSession(model, sess_options=session_options, providers=[ORT_CPU])

            session, threads_note = ort_threads.choose(session, _session_run(session), one_thread)
        loaded = OnnxRuntimeModel(session)
        loaded.execution = ort_report(request, session.get_providers(), skipped)
        loaded.threads = threads_note
        loaded.cores_free_while_running = _cores_free(session)
        return loaded
