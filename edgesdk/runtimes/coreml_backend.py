"""Core ML backend: the only module of the agent that imports coremltools.

Core ML predicts only on macOS. coremltools installs on Linux too (the converters use it),
but there ``is_available()`` is False and loading raises BackendUnavailableError: Linux hosts
validate Core ML variants by their spec instead (see edgesdk.converters).

Core ML compiles from a package directory, so the decrypted package is briefly a set of files:
they go to a memory-backed directory only (:mod:`edgesdk.runtimes.plaintext_dir`; the load is
refused when there is none) and are removed as soon as the model is loaded.
"""

from __future__ import annotations

import platform
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import BackendUnavailableError, InferenceInputError, RuntimeBackendError
from edgesdk.runtimes.execution import ExecutionRequest  # Core ML picks its units from options (compute_units)
from edgesdk.schemas.manifest import TensorSpec

#: Core ML FeatureType data types (ArrayFeatureType.ArrayDataType) → numpy.
_ML_TYPES = {65568: "float32", 65552: "float16", 65600: "float64", 131104: "int32"}


def coreml_can_predict() -> bool:
    """True where coremltools can run predictions: macOS with coremltools installed."""
    if platform.system() != "Darwin":
        return False
    try:
        import coremltools  # noqa: F401
    except ImportError:
        return False
    return True


def spec_tensors(spec: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of a Core ML model spec as TensorSpecs."""

    def one(feature: Any) -> TensorSpec:
        array = feature.type.multiArrayType
        shape: list[int | str | None] = [int(d) for d in array.shape]
        return TensorSpec(name=feature.name, dtype=_ML_TYPES.get(array.dataType, "float32"), shape=shape)

    return [one(f) for f in spec.description.input], [one(f) for f in spec.description.output]


class CoreMLModel:
    """An ``MLModel`` loaded from a package directory (Core ML itself cannot load from memory)."""

    thread_safe = False
    cores_free_while_running = False  # not known here (the compute units are Core ML's choice): scan before the run

    def __init__(self, model: Any, package_dir: Path) -> None:
        self._model = model
        self._package_dir = package_dir
        self.inputs, self.outputs = spec_tensors(model.get_spec())

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._model is None:
            raise RuntimeBackendError("the Core ML model was closed")
        try:
            out = self._model.predict(dict(feeds))
        except (RuntimeError, ValueError, KeyError) as exc:
            raise InferenceInputError(f"Core ML rejected the input: {exc}") from exc
        return {k: np.asarray(v) for k, v in out.items()}

    def close(self) -> None:
        self._model = None
        shutil.rmtree(self._package_dir, ignore_errors=True)  # gone after load already; never left behind


class CoreMLBackend:
    """coremltools on macOS. ``model`` is a zip of the ``.mlpackage`` directory (see load_variant)."""

    name = "coreml"

    def is_available(self) -> bool:
        return coreml_can_predict()

    def load(
        self,
        model: bytes,
        *,
        weights: bytes | None = None,
        options: Mapping[str, str] | None = None,
        execution: ExecutionRequest | None = None,
    ) -> CoreMLModel:
        if not coreml_can_predict():
            raise BackendUnavailableError(
                f"Core ML predicts only on macOS (this is {platform.system()}); validate the spec instead"
            )
        import io
        import zipfile

        import coremltools as ct

        from edgesdk.runtimes.plaintext_dir import choose_plaintext_dir

        # Core ML compiles from a directory: the plaintext package lives in RAM (tmpfs) only,
        # and only until the model is loaded.
        package_dir = Path(tempfile.mkdtemp(prefix="edgesdk-coreml-", dir=choose_plaintext_dir(options)))
        try:
            with zipfile.ZipFile(io.BytesIO(model)) as archive:
                archive.extractall(package_dir)
            units = getattr(ct.ComputeUnit, dict(options or {}).get("compute_units", "ALL"))
            loaded = ct.models.MLModel(str(package_dir / "model.mlpackage"), compute_units=units)
        except Exception as exc:  # noqa: BLE001 - coremltools raises many types
            raise RuntimeBackendError(f"Core ML could not load the model: {exc}") from exc
        finally:
            shutil.rmtree(package_dir, ignore_errors=True)
        return CoreMLModel(loaded, package_dir)
