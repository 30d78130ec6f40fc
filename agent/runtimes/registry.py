"""Runtime name → ``"module:Class"``, imported on first use."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from functools import cache

from edgesdk.agent.runtimes.base import LoadedModel, RuntimeBackend

from edgesdk.errors import BackendUnavailableError, RuntimeBackendError
from edgesdk.offline import disable_vendor_telemetry
from edgesdk.schemas.common import RuntimeName

#: Backend class per runtime, and the package whose presence makes it available.
RUNTIME_BACKENDS: dict[RuntimeName, tuple[str, str]] = {
    RuntimeName.ONNXRUNTIME: ("edgesdk.agent.runtimes.onnxruntime_backend:OnnxRuntimeBackend", "onnxruntime"),
}


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def available_runtimes() -> list[RuntimeName]:
    """Runtimes whose packages are installed on this machine (nothing is imported)."""
    return [name for name, (_, package) in RUNTIME_BACKENDS.items() if _installed(package)]


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
) -> LoadedModel:
    """Load model bytes into ``runtime``, from memory only."""
    return get_backend(runtime).load(model, weights=weights, options=options)
