"""OpenVINO backend: the only module of the agent that imports openvino.

IR is read from memory (xml bytes + a Tensor over the .bin bytes): no file is written.
Options are OpenVINO properties, e.g. ``device=CPU`` and ``INFERENCE_PRECISION_HINT=f32``
(this CPU may otherwise infer fp32 models in bf16, which breaks fp32 parity checks).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgesdk.errors import InferenceInputError, RuntimeBackendError
from edgesdk.runtimes.execution import (
    OPENVINO_CPU,
    ExecutionReport,
    ExecutionRequest,
    choose_openvino_device,
    openvino_report,
)
from edgesdk.runtimes.native_messages import one_line
from edgesdk.schemas.manifest import TensorSpec

_OV_TYPES = {
    "f32": "float32",
    "f16": "float16",
    "f64": "float64",
    "i8": "int8",
    "u8": "uint8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "boolean": "bool",
}


def _spec(port: Any) -> TensorSpec:
    shape: list[int | str | None] = []
    for dim in port.get_partial_shape():
        shape.append(dim.get_length() if dim.is_static else None)
    names = port.get_names()
    name = port.get_any_name() if names else f"port{port.get_index()}"
    return TensorSpec(name=name, dtype=_OV_TYPES.get(port.get_element_type().get_type_name(), "float32"), shape=shape)


class OpenVINOModel:
    """A compiled model; each ``run`` uses its own infer request, so it is thread-safe."""

    thread_safe = True
    cores_free_while_running = False  # OpenVINO's CPU plugin takes every core for a latency-hinted run
    execution: ExecutionReport | None = None  # the device(s) it was compiled for (set by the backend)

    def __init__(self, compiled: Any, weights: np.ndarray | None) -> None:
        self._weights = weights  # the compiled model may share this buffer: keep it alive
        self._compiled = compiled
        self._local = threading.local()
        self.inputs = [_spec(p) for p in compiled.inputs]
        self.outputs = [_spec(p) for p in compiled.outputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._compiled is None:
            raise RuntimeBackendError("the OpenVINO model was closed")
        known = {s.name for s in self.inputs}
        if set(feeds) != known:
            raise InferenceInputError(f"OpenVINO model inputs are {sorted(known)}, got {sorted(feeds)}")
        for spec in self.inputs:
            value = np.asarray(feeds[spec.name])
            # OpenVINO would convert silently; the agent's contract is the model's own dtype.
            if value.dtype.name != spec.dtype:
                raise InferenceInputError(f"input {spec.name!r} must be {spec.dtype}, got {value.dtype.name}")
            if len(value.shape) != len(spec.shape) or any(
                isinstance(w, int) and w != g for w, g in zip(spec.shape, value.shape)
            ):
                raise InferenceInputError(f"input {spec.name!r} must have shape {spec.shape}, got {list(value.shape)}")
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        try:
            result = request.infer({k: np.asarray(v, order="C") for k, v in feeds.items()})  # 0-d stays 0-d
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InferenceInputError(f"OpenVINO rejected the input: {one_line(str(exc))}") from exc
        return {spec.name: np.array(result[port]) for spec, port in zip(self.outputs, self._compiled.outputs)}

    def close(self) -> None:
        self._compiled = None


class OpenVINOBackend:
    """OpenVINO runtime, loading IR (``model.xml`` + ``model.bin``) or ONNX bytes."""

    name = "openvino"

    def is_available(self) -> bool:
        try:
            import openvino  # noqa: F401
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
    ) -> OpenVINOModel:
        import openvino as ov

        opts = dict(options or {})
        core = ov.Core()
        request = execution or ExecutionRequest()
        skipped: dict[str, str] = {}
        if "device" in opts:  # an explicit device (the converter's validation: CPU) wins
            device = opts.pop("device")
        elif set(request.preferred) <= {OPENVINO_CPU}:
            device = OPENVINO_CPU  # no plugin enumeration for a CPU-only profile
        else:
            device, skipped = choose_openvino_device(request, core.available_devices)
        buffer = np.frombuffer(weights, dtype=np.uint8) if weights is not None else None
        try:
            if buffer is not None:
                read = core.read_model(model=bytes(model), weights=ov.Tensor(buffer))
            else:
                read = core.read_model(model=bytes(model))
            try:
                compiled = core.compile_model(read, device, opts)
            except RuntimeError as exc:
                if device == OPENVINO_CPU:
                    raise
                skipped[device] = f"compiling for it failed: {one_line(str(exc))[:200]}"
                device = OPENVINO_CPU
                compiled = core.compile_model(read, device, opts)
        except RuntimeError as exc:
            raise RuntimeBackendError(f"OpenVINO could not load the model on {device}: {one_line(str(exc))}") from exc
        loaded = OpenVINOModel(compiled, buffer)
        loaded.execution = openvino_report(request, device, _execution_devices(compiled), skipped)
        return loaded


def _execution_devices(compiled: Any) -> list[str]:
    """The devices a compiled model really runs on (AUTO's choice); [] where the plugin does not say."""
    try:
        return [str(d) for d in compiled.get_property("EXECUTION_DEVICES")]
    except (RuntimeError, TypeError):
        return []
