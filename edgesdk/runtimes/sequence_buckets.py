"""Sequence buckets: one static-shape model that serves any sequence length up to its longest.

TFLite models from litert-torch have static shapes (its dynamic shapes do not lower Flatten or
Embedding). A token model converted for one length of 32 refuses 16 tokens. So the converter
adds a signature per shorter *bucket* length to the same ``.tflite`` (weights shared, the way
LiteRT exports an LLM's prefill lengths), named ``edgesdk_seq_<length>``; the serving signature
keeps the longest. The runtime pads a request with zeros at the end of its sequence axis to
the shortest bucket that holds it. That is right only for models whose padding is masked
(token ids and attention mask of 0 at the end change nothing): the converter validates every
variant through the buckets, so a model that is not pad-invariant misses its gate instead of
shipping.

This module is shared by the converter (which lengths, from the calibration data) and the
runtime (which bucket, and the padding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

#: Signatures so named are buckets of the serving signature.
BUCKET_PREFIX = "edgesdk_seq_"
#: Bucket lengths are multiples of this (kernels like aligned lengths; fewer, coarser buckets).
BUCKET_STEP = 8
#: Quantiles of the calibration data's used lengths that get a bucket (the longest always has one).
BUCKET_QUANTILES = (0.1, 0.5, 0.9)


def bucket_signature(length: int) -> str:
    return f"{BUCKET_PREFIX}{length}"


def is_bucket(signature: str) -> bool:
    return signature.startswith(BUCKET_PREFIX)


def used_lengths(data: Mapping[str, np.ndarray], axes: Mapping[str, int]) -> np.ndarray:
    """Per sample of ``data`` (the model's layout, samples on axis 0): 1 + the last position
    along the sequence axis (``axes``: input → axis) where any sequence input is non-zero
    (at least 1)."""
    lengths: np.ndarray | None = None
    for name, axis in axes.items():
        value = np.asarray(data[name])
        moved = np.moveaxis(value, axis, -1).reshape(value.shape[0], -1, value.shape[axis])
        nonzero = (moved != 0).any(axis=1)  # (samples, positions)
        last = np.where(nonzero.any(axis=1), nonzero.shape[1] - np.argmax(nonzero[:, ::-1], axis=1), 1)
        lengths = last if lengths is None else np.maximum(lengths, last)
    assert lengths is not None
    return lengths


def choose_buckets(lengths: np.ndarray, longest: int) -> list[int]:
    """Bucket lengths below ``longest`` at the quantiles of the used ``lengths``, rounded up to
    ``BUCKET_STEP``; empty when the data's lengths give none shorter than the longest."""
    chosen = set()
    for q in BUCKET_QUANTILES:
        length = int(math.ceil(float(np.quantile(lengths, q)) / BUCKET_STEP) * BUCKET_STEP)
        if 0 < length < longest:
            chosen.add(length)
    return sorted(chosen)


def trim(feeds: Mapping[str, np.ndarray], axes: Mapping[str, int]) -> dict[str, np.ndarray]:
    """One sample's feeds (the model's layout, batch 1) cut to its used length: what a client
    of the device would send."""
    present = {name: axis for name, axis in axes.items() if name in feeds}
    if not present:
        return dict(feeds)
    length = int(used_lengths(feeds, present).max())
    out = dict(feeds)
    for name, axis in present.items():
        out[name] = np.take(np.asarray(out[name]), np.arange(length), axis=axis)
    return out


def pad(value: np.ndarray, axis: int, length: int) -> np.ndarray:
    """``value`` with zeros appended along ``axis`` up to ``length``."""
    missing = length - value.shape[axis]
    if missing <= 0:
        return value
    widths = [(0, 0)] * value.ndim
    widths[axis] = (0, missing)
    return np.pad(value, widths)
