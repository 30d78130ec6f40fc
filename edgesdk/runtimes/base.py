"""The protocol every runtime backend implements.

Models are always handed over as bytes already decrypted in memory: no backend takes a
path, so no backend can be tempted to write plaintext to disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from edgesdk.runtimes.execution import ExecutionRequest
from edgesdk.schemas.manifest import TensorSpec


@runtime_checkable
class LoadedModel(Protocol):
    """A model ready to run. ``run`` is thread-safe unless ``thread_safe`` is False."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    thread_safe: bool
    #: True when a run leaves a CPU core idle (an accelerator runs it, or fewer runtime threads
    #: than cores): the agent then NaN/Inf-scans large inputs on that core during the run
    #: instead of before it (agent/tensor_signature.py). Backends that do not know say False.
    cores_free_while_running: bool

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one inference; inputs and outputs by tensor name."""
        ...

    def close(self) -> None:
        """Release the runtime's memory."""
        ...


class RuntimeBackend(Protocol):
    """A runtime that can load model bytes: one module per runtime under ``edgesdk/runtimes``."""

    name: str

    def is_available(self) -> bool:
        """True when the runtime's Python package can be imported here."""
        ...

    def load(
        self,
        model: bytes,
        *,
        weights: bytes | None = None,
        options: Mapping[str, str] | None = None,
        execution: ExecutionRequest | None = None,
    ) -> LoadedModel:
        """Load from memory. ``weights`` is the second file of two-file formats (OpenVINO .bin);
        ``execution`` what to run on, preferred first (the profile's; see runtimes/execution.py).
        The loaded model's ``execution`` attribute (an ExecutionReport), where it has one, says
        what it runs on and why not the first choice."""
        ...
