"""Calibration and validation data: ``.npz`` files keyed by input name, checked against the model.

Inside the pipeline the data is sample-major (axis 0 the sample); converters/input_spec.py
says how each array of the file maps to that from the model's own layout.

A wrong file is caught here, before any converter runs, with the file, the input and both
shapes/dtypes in the message ("calibration data cal.npz: input 'image' is float64; the
model takes float32").
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
from edgesdk.converters.input_spec import InputLayout, Placement, resolve_layout, to_sample_major

from edgesdk.errors import UsageError
from edgesdk.schemas.manifest import TensorSpec

#: Keys of a validation file that are not model inputs.
LABEL_KEY = "labels"


def load_npz(path: Path | str, what: str) -> dict[str, np.ndarray]:
    """Read an ``.npz`` into memory; UsageError naming the file when it cannot be read."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: np.asarray(archive[key]) for key in archive.files}
    except FileNotFoundError as exc:
        raise UsageError(f"{what} data {path}: file not found") from exc
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise UsageError(f"{what} data {path}: not a readable .npz file ({exc})") from exc


def check_against_inputs(
    data: Mapping[str, np.ndarray],
    inputs: list[TensorSpec],
    what: str,
    where: str,
    layout: InputLayout | None = None,
    declared: Mapping[str, int | str] | None = None,
) -> dict[str, np.ndarray]:
    """The model inputs from ``data``, checked (dtype, rank, fixed dims) and made sample-major.

    Each array is in the model's own layout; where its samples are comes from ``layout`` (or,
    when not given, from this file, ``declared`` axes and the model: see input_spec.py).
    """
    for spec in inputs:
        if spec.name not in data:
            keys = ", ".join(sorted(data)) or "none"
            raise UsageError(f"{what} data {where}: no array for input {spec.name!r} (keys: {keys})")
        array = data[spec.name]
        # A quantized input (a prebuilt int8 .tflite) also takes real values, quantized with its
        # parameters as the agent does: the public signature of an int8 variant is float.
        real_for_quantized = spec.quantization is not None and array.dtype.kind == "f"
        if array.dtype.name != spec.dtype and not real_for_quantized:
            raise UsageError(
                f"{what} data {where}: input {spec.name!r} is {array.dtype.name}; the model takes {spec.dtype}"
            )
    if layout is None:
        layout = resolve_layout(inputs, [], data, declared, what=what, where=where)
    return to_sample_major(data, inputs, layout, declared, what, where)


def sample_count(data: Mapping[str, np.ndarray]) -> int:
    return int(next(iter(data.values())).shape[0])


def batches(data: Mapping[str, np.ndarray], size: int) -> Iterator[dict[str, np.ndarray]]:
    """Slices of ``size`` samples along axis 0."""
    total = sample_count(data)
    for start in range(0, total, size):
        yield {k: np.ascontiguousarray(v[start : start + size]) for k, v in data.items()}


def subset(data: Mapping[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    """The first ``count`` samples."""
    return {k: np.ascontiguousarray(v[:count]) for k, v in data.items()}


def synthetic_inputs(
    inputs: list[TensorSpec], count: int, seed: int = 0, layout: InputLayout | None = None
) -> dict[str, np.ndarray]:
    """Random sample-major inputs of the model's shapes (dynamic dims → 1), for when no data is given."""
    rng = np.random.default_rng(seed)
    layout = layout or InputLayout()
    out: dict[str, np.ndarray] = {}
    for spec in inputs:
        placed = layout.of_input(spec.name)
        dims = [d if isinstance(d, int) else 1 for d in spec.shape]
        if placed.placement == Placement.BATCHED and dims:
            shape = [count, *(d for i, d in enumerate(dims) if i != placed.axis)]
        else:
            shape = [count, *dims]
        if spec.dtype.startswith("float"):
            out[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype == "bool":
            out[spec.name] = np.ones(shape, dtype=bool)
        else:
            out[spec.name] = rng.integers(0, 100, size=shape).astype(spec.dtype)
        if placed.placement == Placement.CONSTANT:
            out[spec.name] = np.broadcast_to(out[spec.name][:1], shape)  # one value, fed with every sample
    return out
