"""Calibration and validation data: ``.npz`` files keyed by input name, checked against the model.

A wrong file is caught here, before any converter runs, with the file, the input and both
shapes/dtypes in the message ("calibration data cal.npz: input 'image' is float64; the
model takes float32").
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

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
    data: Mapping[str, np.ndarray], inputs: list[TensorSpec], what: str, where: str
) -> dict[str, np.ndarray]:
    """The model inputs from ``data``, each with the model's dtype, rank and fixed dims.

    Axis 0 is the sample axis of the file, so it may differ from a fixed batch of 1.
    """
    checked: dict[str, np.ndarray] = {}
    counts: set[int] = set()
    for spec in inputs:
        if spec.name not in data:
            keys = ", ".join(sorted(data)) or "none"
            raise UsageError(f"{what} data {where}: no array for input {spec.name!r} (keys: {keys})")
        array = data[spec.name]
        if array.dtype.name != spec.dtype:
            raise UsageError(
                f"{what} data {where}: input {spec.name!r} is {array.dtype.name}; the model takes {spec.dtype}"
            )
        want = ["N", *[d if isinstance(d, int) else "?" for d in spec.shape[1:]]]
        if array.ndim != len(spec.shape) or any(
            isinstance(w, int) and w != g for w, g in zip(want[1:], array.shape[1:])
        ):
            raise UsageError(
                f"{what} data {where}: input {spec.name!r} has shape {tuple(array.shape)}; "
                f"the model expects ({', '.join(str(w) for w in want)})"
            )
        if array.shape[0] == 0:
            raise UsageError(f"{what} data {where}: input {spec.name!r} has no samples")
        counts.add(array.shape[0])
        checked[spec.name] = array
    if len(counts) > 1:
        raise UsageError(f"{what} data {where}: inputs have different sample counts {sorted(counts)}")
    return checked


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


def synthetic_inputs(inputs: list[TensorSpec], count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the model's shapes (dynamic dims → 1), for when no data is given."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for spec in inputs:
        shape = [count, *[d if isinstance(d, int) else 1 for d in spec.shape[1:]]]
        if spec.dtype.startswith("float"):
            out[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype == "bool":
            out[spec.name] = np.ones(shape, dtype=bool)
        else:
            out[spec.name] = rng.integers(0, 100, size=shape).astype(spec.dtype)
    return out
