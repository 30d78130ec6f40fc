"""Runtime name → ``"module:Class"``, imported on first use."""

from __future__ import annotations

import importlib
import importlib.util
import io
import platform
import zipfile
from collections.abc import Mapping
from functools import cache

from edgesdk.errors import BackendUnavailableError, RuntimeBackendError
from edgesdk.offline import disable_vendor_telemetry
from edgesdk.runtimes.base import LoadedModel, RuntimeBackend
from edgesdk.runtimes.execution import ExecutionRequest
from edgesdk.schemas.common import RuntimeName

#: Backend class per runtime, and the package whose presence makes it available.
RUNTIME_BACKENDS: dict[RuntimeName, tuple[str, str]] = {
    RuntimeName.ONNXRUNTIME: ("edgesdk.runtimes.onnxruntime_backend:OnnxRuntimeBackend", "onnxruntime"),
    RuntimeName.LITERT: ("edgesdk.runtimes.litert_backend:LiteRTBackend", "ai_edge_litert"),
    RuntimeName.TFLITE_RUNTIME: ("edgesdk.runtimes.litert_backend:LiteRTBackend", "tflite_runtime"),
    RuntimeName.OPENVINO: ("edgesdk.runtimes.openvino_backend:OpenVINOBackend", "openvino"),
    RuntimeName.COREML: ("edgesdk.runtimes.coreml_backend:CoreMLBackend", "coremltools"),
}

#: Runtimes that predict only on one OS even where their package installs elsewhere.
RUNTIME_PLATFORMS: dict[RuntimeName, str] = {RuntimeName.COREML: "Darwin"}

#: The file names of a variant, per format (see load_variant).
VARIANT_FILES: dict[RuntimeName, tuple[str, ...]] = {
    RuntimeName.ONNXRUNTIME: ("model.onnx",),
    RuntimeName.LITERT: ("model.tflite",),
    RuntimeName.TFLITE_RUNTIME: ("model.tflite",),
    RuntimeName.OPENVINO: ("model.xml", "model.bin"),
    RuntimeName.COREML: ("model.mlpackage/",),
}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _runs_here(name: RuntimeName) -> bool:
    wanted = RUNTIME_PLATFORMS.get(name)
    return wanted is None or platform.system() == wanted


def available_runtimes() -> list[RuntimeName]:
    """Runtimes whose packages are installed on this machine (nothing is imported)."""
    return [name for name, (_, package) in RUNTIME_BACKENDS.items() if _installed(package) and _runs_here(name)]


@cache
def get_backend(runtime: RuntimeName | str) -> RuntimeBackend:
    """The backend for ``runtime``; BackendUnavailableError if its package is missing."""
    try:
        name = RuntimeName(runtime)
    except ValueError as exc:
        known = ", ".join(r.value for r in RUNTIME_BACKENDS)
        raise RuntimeBackendError(f"unknown runtime {runtime!r}; known: {known}") from exc
    if name not in RUNTIME_BACKENDS:
        known = ", ".join(r.value for r in RUNTIME_BACKENDS)
        raise BackendUnavailableError(f"runtime {name.value!r} has no backend in this agent; known: {known}")
    target, package = RUNTIME_BACKENDS[name]
    if not _installed(package):
        raise BackendUnavailableError(
            f"runtime {name.value!r} needs the Python package {package!r}, which is not installed"
        )
    if not _runs_here(name):
        raise BackendUnavailableError(
            f"runtime {name.value!r} runs only on {RUNTIME_PLATFORMS[name]}, not on {platform.system()}"
        )
    disable_vendor_telemetry()
    module_name, class_name = target.split(":")
    backend: RuntimeBackend = getattr(importlib.import_module(module_name), class_name)()
    return backend


def load_model(
    runtime: RuntimeName | str,
    model: bytes,
    *,
    weights: bytes | None = None,
    options: Mapping[str, str] | None = None,
    execution: ExecutionRequest | None = None,
) -> LoadedModel:
    """Load model bytes into ``runtime``, from memory only."""
    return get_backend(runtime).load(model, weights=weights, options=options, execution=execution)


def _basename_map(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """Accept ``"model.onnx"`` as well as ``"artifacts/onnx-fp32/model.onnx"`` keys."""
    mapped: dict[str, bytes] = {}
    for key, data in files.items():
        parts = key.replace("\\", "/").split("/")
        if any(p.endswith(".mlpackage") for p in parts):
            index = next(i for i, p in enumerate(parts) if p.endswith(".mlpackage"))
            mapped["/".join(["model.mlpackage", *parts[index + 1 :]])] = data
        else:
            mapped[parts[-1]] = data
    return mapped


def _zip_package(files: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name in sorted(files):
            if name.startswith("model.mlpackage/") and not name.endswith("/"):
                archive.writestr(name, files[name])
    return buffer.getvalue()


def load_variant(
    runtime: RuntimeName | str,
    files: Mapping[str, bytes],
    options: Mapping[str, str] | None = None,
    execution: ExecutionRequest | None = None,
) -> LoadedModel:
    """Load a variant from its files in memory (file name → bytes), as ``edgesdk convert`` wrote them.

    onnx → ``model.onnx``; tflite → ``model.tflite``; openvino → ``model.xml`` + ``model.bin``;
    coreml → every file under ``model.mlpackage/``.
    """
    try:
        name = RuntimeName(runtime)
    except ValueError as exc:
        known = ", ".join(r.value for r in RUNTIME_BACKENDS)
        raise RuntimeBackendError(f"unknown runtime {runtime!r}; known: {known}") from exc
    by_name = _basename_map(files)
    expected = VARIANT_FILES.get(name, ())
    if name == RuntimeName.COREML:
        if not any(k.startswith("model.mlpackage/") for k in by_name):
            raise RuntimeBackendError(f"a coreml variant needs model.mlpackage/ files; got {sorted(files)}")
        return get_backend(name).load(_zip_package(by_name), options=options, execution=execution)
    missing = [f for f in expected if f not in by_name]
    if missing:
        raise RuntimeBackendError(f"a {name.value} variant needs {', '.join(expected)}; missing {', '.join(missing)}")
    weights = by_name.get(expected[1]) if len(expected) > 1 else None
    return get_backend(name).load(by_name[expected[0]], weights=weights, options=options, execution=execution)
