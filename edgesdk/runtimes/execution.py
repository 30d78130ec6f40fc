"""Where a runtime runs a model: the profile's execution providers, devices or delegates, chosen
from what this machine actually has, with CPU as the fallback and the reason when it is taken.

The device profile lists, per runtime, what to run on, preferred first
(``RuntimeSupport.execution_providers``):

* onnxruntime: execution providers — ``TensorrtExecutionProvider``, ``CUDAExecutionProvider``
  on Jetson (NVIDIA's onnxruntime-gpu build), ``OpenVINOExecutionProvider`` on Intel;
* OpenVINO: devices — ``GPU``, ``NPU``, ``CPU``: more than one available becomes ``AUTO:GPU,NPU,CPU``
  (OpenVINO's automatic device selection, in that priority);
* LiteRT: delegates — ``edgetpu`` (``load_delegate("libedgetpu.so.1")``), ``gpu``
  (``load_delegate("libtensorflowlite_gpu_delegate.so")``), ``xnnpack`` (built into the
  interpreter: its CPU path).

What is missing here (a CPU-only onnxruntime wheel, no GPU plugin or driver, no Edge TPU
library or device) is skipped, and the model runs on what remains, CPU last; the backend's
:class:`ExecutionReport` says what was asked for, what runs, and why not the first choice. The
agent shows it per variant in ``/v1/status``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

ORT_CPU = "CPUExecutionProvider"
OPENVINO_CPU = "CPU"
LITERT_CPU = "xnnpack"
#: LiteRT delegates and the shared library that provides each (Linux names).
LITERT_DELEGATE_LIBRARIES = {
    "edgetpu": "libedgetpu.so.1",
    "gpu": "libtensorflowlite_gpu_delegate.so",
}


@dataclass(frozen=True)
class ExecutionRequest:
    """What to run on, preferred first, as the profile lists it (empty: the runtime's default)."""

    preferred: tuple[str, ...] = ()

    @classmethod
    def of(cls, names: Iterable[str]) -> ExecutionRequest:
        return cls(tuple(n for n in names if n))


@dataclass(frozen=True)
class ExecutionReport:
    """What a loaded model runs on: ``using`` (in the runtime's own terms), and ``fallback``: why
    not the first of ``requested`` (None when it got it)."""

    requested: tuple[str, ...]
    using: tuple[str, ...]
    fallback: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "requested": list(self.requested),
            "using": list(self.using),
            "fallback": self.fallback,
            "skipped": dict(self.skipped),
        }


def _fallback(requested: Sequence[str], using: Sequence[str], skipped: dict[str, str]) -> str | None:
    if not requested or (using and using[0] == requested[0]):
        return None
    reasons = "; ".join(f"{name}: {why}" for name, why in skipped.items())
    return f"running on {', '.join(using)}, not {requested[0]}" + (f" ({reasons})" if reasons else "")


# -- onnxruntime -------------------------------------------------------------------------------


def choose_ort_providers(request: ExecutionRequest, available: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The requested providers this onnxruntime build has, in order, CPU always last."""
    chosen: list[str] = []
    skipped: dict[str, str] = {}
    for name in request.preferred:
        if name in available:
            if name not in chosen:
                chosen.append(name)
        else:
            skipped[name] = f"not in this onnxruntime build (it has {', '.join(available)})"
    if ORT_CPU not in chosen:
        chosen.append(ORT_CPU)
    return chosen, skipped


def ort_report(request: ExecutionRequest, session_providers: Sequence[str], skipped: dict[str, str]) -> ExecutionReport:
    """After the session exists: the providers it really registered (onnxruntime drops one whose
    libraries — CUDA, cuDNN, TensorRT — do not load, with only a warning)."""
    requested = request.preferred or (ORT_CPU,)
    skipped = dict(skipped)
    for name in request.preferred:
        if name not in skipped and name not in session_providers:
            skipped[name] = "onnxruntime could not initialise it (its libraries or the device are missing)"
    using = tuple(session_providers)
    return ExecutionReport(tuple(requested), using, _fallback(requested, using, skipped), skipped)


# -- OpenVINO ----------------------------------------------------------------------------------


def choose_openvino_device(request: ExecutionRequest, available: Sequence[str]) -> tuple[str, dict[str, str]]:
    """``AUTO:<requested devices present here>`` when more than one is, else the one present, else CPU.

    ``available`` is ``Core().available_devices`` (``GPU.0``, ``GPU.1`` count as ``GPU``)."""
    present = {name.split(".")[0] for name in available}
    chosen: list[str] = []
    skipped: dict[str, str] = {}
    for name in request.preferred:
        base = name.split(".")[0]
        if base == "AUTO" or base in present or name in available:
            chosen.append(name)
        else:
            skipped[name] = f"not available here (OpenVINO sees {', '.join(available) or 'no device'})"
    if not chosen:
        return OPENVINO_CPU, skipped
    if len(chosen) == 1:
        return chosen[0], skipped
    return "AUTO:" + ",".join(chosen), skipped


def openvino_report(
    request: ExecutionRequest, device: str, execution_devices: Sequence[str], skipped: dict[str, str]
) -> ExecutionReport:
    requested = request.preferred or (OPENVINO_CPU,)
    using = tuple(execution_devices) or (device,)
    first = requested[0]
    got_first = any(u.split(".")[0] == first.split(".")[0] for u in using[:1])
    fallback = None if got_first else _fallback(requested, using, skipped) or f"running on {', '.join(using)}"
    return ExecutionReport(tuple(requested), using, fallback, dict(skipped))


# -- LiteRT ------------------------------------------------------------------------------------


def open_litert_delegates(
    request: ExecutionRequest, load_delegate: Callable[[str], Any] | None
) -> tuple[list[Any], tuple[str, ...], dict[str, str]]:
    """The first requested delegate that loads (one: LiteRT applies delegates in turn and the
    first claims the ops it can), else XNNPACK, the interpreter's CPU path. Returns the delegate
    objects for ``Interpreter(experimental_delegates=...)``, what runs, and what was skipped."""
    skipped: dict[str, str] = {}
    for name in request.preferred:
        if name == LITERT_CPU:
            return [], (LITERT_CPU,), skipped
        library = LITERT_DELEGATE_LIBRARIES.get(name)
        if library is None:
            skipped[name] = f"unknown LiteRT delegate (known: {', '.join([*LITERT_DELEGATE_LIBRARIES, LITERT_CPU])})"
            continue
        if load_delegate is None:
            skipped[name] = "this LiteRT has no load_delegate"
            continue
        try:
            return [load_delegate(library)], (name,), skipped
        except (OSError, ValueError, RuntimeError) as exc:
            skipped[name] = f"load_delegate({library!r}) failed: {str(exc).strip() or type(exc).__name__}"
    return [], (LITERT_CPU,), skipped


def litert_report(request: ExecutionRequest, using: tuple[str, ...], skipped: dict[str, str]) -> ExecutionReport:
    requested = request.preferred or (LITERT_CPU,)
    return ExecutionReport(tuple(requested), using, _fallback(requested, using, skipped), dict(skipped))
