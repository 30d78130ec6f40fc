"""The reference profile: what the validation data looked like, per input and output tensor.

``edgesdk convert`` computes it (:func:`build_profile`) and writes ``PROFILE_FILE`` next to
the report; ``edgesdk package`` signs it into the bundle's manifest (``reference``); the device
counts its live values into the same fixed bins and reports drift (agent/drift/).

Per tensor: the value range, and value histograms over fixed edges (quantiles of the validation
values, so each inner bin held about the same share), one per channel where the tensor has a
channel axis (at most :data:`MAX_CHANNELS`), else one. A classification output also gets its
class distribution (arg-max per sample) and a histogram of its top-1 confidence.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from edgesdk.drift.schema import (
    BINS,
    MAX_CHANNELS,
    MAX_CLASSES,
    PROFILE_FILE,
    Histogram,
    ReferenceProfile,
    TensorProfile,
)
from edgesdk.drift.scores import bin_counts, closed_edges

#: Values per channel the quantiles are taken over (a fixed stride beyond it).
_QUANTILE_VALUES = 1 << 20
CONFIDENCE_EDGES = [round(0.1 * i, 1) for i in range(11)]


def _round(value: float) -> float:
    return float(f"{value:.6g}")


def channel_axis_of(shape: tuple[int, ...]) -> int | None:
    """The channel axis of a batch of samples (axis 0 the samples), as a negative axis: NCHW's
    or NHWC's (the smaller of the two), a sequence's or a table's last; None for one histogram."""
    ndim = len(shape)
    if ndim == 4:
        axis = 1 if shape[1] <= shape[3] else 3
    elif ndim in (2, 3):
        axis = ndim - 1
    else:
        return None
    return axis - ndim if 1 < shape[axis] <= MAX_CHANNELS else None


def channels(array: np.ndarray, channel_axis: int | None) -> Iterator[np.ndarray]:
    """The values of each channel, one copy at a time (all the values without a channel axis)."""
    if channel_axis is None:
        yield array.reshape(-1)
        return
    for c in range(array.shape[channel_axis]):
        yield np.take(array, c, axis=channel_axis).reshape(-1)


def histogram_of(values: np.ndarray) -> Histogram:
    """Decile edges of one channel's values and the share of them in each bin, both from at
    most ~1M of them (a fixed stride: 512 MobileNetV2 images hold 26M values a channel)."""
    values = values[:: max(1, values.size // _QUANTILE_VALUES)].astype(np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        values = np.zeros(1)
    quantiles = np.quantile(values, np.linspace(0, 1, BINS + 1))
    edges = sorted({_round(q) for q in quantiles})
    if len(edges) == 1:  # every value the same: one bin just wide enough to hold it
        edges.append(_round(edges[0] + max(abs(edges[0]) * 1e-5, 1e-6)))
    counts = bin_counts(closed_edges(edges), values)
    return Histogram(edges=edges, shares=[_round(c / values.size) for c in counts])


def confidences(output: np.ndarray, softmax: bool) -> np.ndarray:
    """Top-1 confidence per sample of a (samples, classes) output."""
    values = output.astype(np.float64, copy=False)
    if softmax:
        shifted = np.exp(values - values.max(axis=1, keepdims=True))
        values = shifted / shifted.sum(axis=1, keepdims=True)
    return values.max(axis=1)


def _is_probabilities(output: np.ndarray) -> bool:
    return bool(output.min() >= 0 and output.max() <= 1 and np.allclose(output.sum(axis=1), 1, atol=1e-3))


def _finite_range(batch: np.ndarray) -> tuple[float, float]:
    """(min, max) of the finite values; without a copy of the tensor when all are finite."""
    if batch.size == 0:
        return 0.0, 0.0
    low, high = float(batch.min()), float(batch.max())
    if np.isfinite(low) and np.isfinite(high):
        return low, high
    finite = batch[np.isfinite(batch)]
    return (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)


def tensor_profile(batch: np.ndarray, *, classify: bool = False, plain: bool = True) -> TensorProfile:
    """One tensor's profile from its validation values (samples on axis 0). ``plain``: the data is
    in the model's own layout, so channel axes mean what the device will see."""
    batch = np.asarray(batch)
    axis = channel_axis_of(batch.shape) if plain else None
    low, high = _finite_range(batch)
    profile: dict[str, object] = {
        "ndim": batch.ndim,
        "channel_axis": axis,
        "min": low,
        "max": high,
        "histograms": [histogram_of(c) for c in channels(batch, axis)],
    }
    if classify and batch.ndim == 2 and 2 <= batch.shape[1] <= MAX_CLASSES:
        softmax = not _is_probabilities(batch)
        top = np.bincount(batch.argmax(axis=1), minlength=batch.shape[1])
        counts = bin_counts(closed_edges(CONFIDENCE_EDGES), confidences(batch, softmax))
        profile["classes"] = [_round(c / batch.shape[0]) for c in top]
        profile["confidence"] = Histogram(edges=CONFIDENCE_EDGES, shares=[_round(c / batch.shape[0]) for c in counts])
        profile["softmax"] = softmax
    return TensorProfile.model_validate(profile)


def build_profile(
    inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], *, classify: bool, plain: bool = True
) -> ReferenceProfile:
    """The reference profile of validation ``inputs`` and the reference model's ``outputs``
    (samples on axis 0). ``classify``: outputs of shape (samples, classes) are class scores."""
    samples = int(next(iter(inputs.values())).shape[0]) if inputs else 1
    return ReferenceProfile(
        samples=max(1, samples),
        inputs={name: tensor_profile(v, plain=plain) for name, v in inputs.items()},
        outputs={name: tensor_profile(v, classify=classify, plain=plain) for name, v in outputs.items()},
    )


def write_profile(
    directory: Path, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], *, classify: bool, plain: bool
) -> Path:
    """Write ``PROFILE_FILE`` into ``directory`` (a convert output dir) and return its path."""
    profile = build_profile(inputs, outputs, classify=classify, plain=plain)
    path = directory / PROFILE_FILE
    path.write_text(profile.model_dump_json() + "\n", encoding="utf-8")
    return path
