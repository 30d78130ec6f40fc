"""One model's live counts since its last telemetry report, over its reference profile's bins.

Counting is the whole live summary: each histogram of the reference keeps an integer count per
bin (no sketch: the bins are fixed by the reference, so PSI, Jensen-Shannon and the binned
Kolmogorov-Smirnov over them are exact; BENCHMARKS.md compares this with KLL and t-digest). A large tensor is read with a fixed
stride, about :data:`VALUES_PER_TENSOR` values per request; its min and max (the out-of-range
and constant checks) are taken over every value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import numpy as np

from edgesdk.drift.profile import confidences
from edgesdk.drift.schema import ReferenceProfile, TensorProfile
from edgesdk.drift.scores import bin_counts, closed_edges, js_distance, ks_distance, psi
from edgesdk.schemas.messages import DriftScore, ModelQuality

#: Values of one tensor counted per request, all channels together (a fixed stride beyond it):
#: ~1,400 a channel of a 3x224x224 image, plenty for 10 bins (BENCHMARKS.md has the cost).
VALUES_PER_TENSOR = 4096
#: A histogram is scored only once the window counted this many values per bin, a class
#: distribution this many answers per class: fewer make a noisy PSI out of an unchanged stream.
PER_BIN = 5


def sampled(value: np.ndarray, axis: int | None, channels: int) -> np.ndarray | None:
    """``value`` as (channels, values), read with a fixed stride down to about
    :data:`VALUES_PER_TENSOR` values; a view where the layout allows (NCHW or NHWC with one
    sample). None when the tensor does not have the profile's channels."""
    if axis is None:
        flat = value.reshape(1, -1)
    elif value.shape[axis] != channels:
        return None
    elif axis == -1:
        flat = value.reshape(-1, channels).T
    else:
        flat = np.moveaxis(value, axis, 0).reshape(channels, -1)
    stride = max(1, flat.size // VALUES_PER_TENSOR)
    return flat[:, ::stride]


class _TensorCounts:
    """The counts of one tensor: a (channels, bins) matrix over the reference's edges (rows as
    wide as the widest histogram), and class and confidence counts for a classification output."""

    def __init__(self, profile: TensorProfile) -> None:
        self.profile = profile
        self.edges = [closed_edges(h.edges) for h in profile.histograms]
        self.widths = [len(e) + 1 for e in self.edges]  # underflow, bins, overflow
        self.counts = np.zeros((len(self.edges), max(self.widths)), dtype=np.int64)
        self._offsets = (np.arange(len(self.edges)) * self.counts.shape[1])[:, None]
        self._padded = np.full((len(self.edges), self.counts.shape[1] - 1), np.inf)  # edges, +inf after
        for row, e in zip(self._padded, self.edges, strict=True):
            row[: len(e)] = e
        self.classes = np.zeros(len(profile.classes), dtype=np.int64) if profile.classes else None
        self.confidence_edges = closed_edges(profile.confidence.edges) if profile.confidence else None
        self.confidence = np.zeros(len(profile.confidence.edges) + 1, dtype=np.int64) if profile.confidence else None

    def measure(self, value: np.ndarray) -> list[np.ndarray] | None:
        """This request's counts (computed outside the lock); None when the shape does not fit."""
        profile = self.profile
        axis = profile.channel_axis if value.ndim == profile.ndim else None
        if axis is None and len(self.widths) > 1:
            return None
        values = sampled(value, axis, len(self.widths))
        if values is None:
            return None
        counted = [np.bincount(self._bins(values).ravel(), minlength=self.counts.size).reshape(self.counts.shape)]
        if self.classes is not None and value.ndim == 2 and value.shape[1] == len(self.classes):
            assert self.confidence_edges is not None
            counted.append(np.bincount(value.argmax(axis=1), minlength=len(self.classes)))
            counted.append(bin_counts(self.confidence_edges, confidences(value, profile.softmax)))
        return counted

    def _bins(self, values: np.ndarray) -> np.ndarray:
        """Each value's place in the counts matrix: its channel's row, the bin searchsorted
        ('right') finds. Few values a channel (a logits vector): one comparison with every edge
        of every channel at once; many (an image): one searchsorted per channel, on a float64
        copy (4,096 values of a 3x224x224 image: ~50 us, BENCHMARKS.md)."""
        if values.shape[1] <= 16:
            return (values[:, :, None] >= self._padded[:, None, :]).sum(axis=2) + self._offsets
        rows = np.array(values, dtype=np.float64)
        width = self.counts.shape[1]
        return np.concatenate(
            [np.searchsorted(e, row, side="right") + c * width for c, (e, row) in enumerate(zip(self.edges, rows))]
        )

    def add(self, counted: list[np.ndarray]) -> None:
        self.counts += counted[0]
        if len(counted) == 3 and self.classes is not None and self.confidence is not None:
            self.classes += counted[1]
            self.confidence += counted[2]

    def score(self) -> DriftScore | None:
        """The worst channel's PSI, JS and KS (and the class and confidence distributions'; KS
        only over ordered bins, not class shares), or None before anything was counted."""
        profile = self.profile
        rows = [row[:width] for row, width in zip(self.counts, self.widths, strict=True)]
        # (reference shares, live counts, whether the bins are ordered: KS needs a CDF)
        candidates = [(h.shares, row, True) for h, row in zip(profile.histograms, rows, strict=True)]
        if self.classes is not None and profile.classes:
            candidates.append((profile.classes, self.classes, False))
        if self.confidence is not None and profile.confidence:
            candidates.append((profile.confidence.shares, self.confidence, True))
        pairs = [(ref, live, ordered) for ref, live, ordered in candidates if live.sum() >= PER_BIN * len(live)]
        if not pairs:
            return None
        ks = [ks_distance(ref, live) for ref, live, ordered in pairs if ordered]
        return DriftScore(
            psi=round(max(psi(ref, live) for ref, live, _ in pairs), 4),
            js=round(max(js_distance(ref, live) for ref, live, _ in pairs), 4),
            ks=round(max(ks), 4) if ks else None,
        )


class ModelWindow:
    """What one model's answers looked like since the last report (thread-safe)."""

    def __init__(self, profile: ReferenceProfile | None, key: object = None) -> None:
        self.profile = profile
        self.key = key  # the bundle this profile came from
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        profile = self.profile
        self.started = time.monotonic()
        self.samples = self.nonfinite = self.out_of_range = self.constant = 0
        self.inputs = {n: _TensorCounts(t) for n, t in (profile.inputs if profile else {}).items()}
        self.outputs = {n: _TensorCounts(t) for n, t in (profile.outputs if profile else {}).items()}

    def add(self, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        """Count one answered request."""
        nonfinite = out_of_range = constant = False
        counted: list[tuple[_TensorCounts, list[np.ndarray]]] = []
        for name, value in feeds.items():
            array = np.asarray(value)
            if array.size == 0:
                continue
            low, high = array.min(), array.max()
            constant |= bool(low == high) and array.size > 1
            if array.dtype.kind == "f" and not (np.isfinite(low) and np.isfinite(high)):
                nonfinite = True  # answered: the agent's api.allow_nonfinite is on
                continue
            counts = self.inputs.get(name)
            if counts is not None:
                out_of_range |= bool(low < counts.profile.min or high > counts.profile.max)
                measured = counts.measure(array)
                if measured is not None:
                    counted.append((counts, measured))
        for name, value in outputs.items():
            counts = self.outputs.get(name)
            if counts is not None:
                measured = counts.measure(np.asarray(value))
                if measured is not None:
                    counted.append((counts, measured))
        with self._lock:
            self.samples += 1
            self.nonfinite += nonfinite
            self.out_of_range += out_of_range
            self.constant += constant
            for counts, measured in counted:
                counts.add(measured)

    def report(self, refused_nonfinite: int = 0) -> ModelQuality:
        """This window's figures; the window starts again empty."""
        with self._lock:
            quality = self._figures(refused_nonfinite)
            self._reset()
        return quality

    def peek(self, refused_nonfinite: int = 0) -> ModelQuality:
        """This window's figures so far; the window goes on (``/metrics`` reads it this way, so
        a scrape never takes counts from the telemetry report)."""
        with self._lock:
            return self._figures(refused_nonfinite)

    def _figures(self, refused_nonfinite: int) -> ModelQuality:
        inputs = {n: s for n, c in self.inputs.items() if (s := c.score()) is not None}
        outputs = {n: s for n, c in self.outputs.items() if (s := c.score()) is not None}
        return ModelQuality(
            samples=self.samples,
            window_s=round(time.monotonic() - self.started, 3),
            reference=self.profile is not None,
            inputs=inputs,
            outputs=outputs,
            nonfinite=self.nonfinite + refused_nonfinite,
            out_of_range=self.out_of_range,
            constant=self.constant,
        )
