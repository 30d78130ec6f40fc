"""Inference runtimes behind one protocol, imported lazily by name.

A device without OpenVINO never imports OpenVINO: :func:`load_runtime` imports the backend
module only when a variant of that runtime is loaded.
"""

from edgesdk.runtimes.base import LoadedModel, RuntimeBackend
from edgesdk.runtimes.registry import (
    RUNTIME_BACKENDS,
    available_runtimes,
    get_backend,
    load_model,
    load_variant,
)

__all__ = [
    "RUNTIME_BACKENDS",
    "LoadedModel",
    "RuntimeBackend",
    "available_runtimes",
    "get_backend",
    "load_model",
    "load_variant",
]
