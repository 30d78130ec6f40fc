"""Drift scores over a reference's fixed bins: population stability index, Jensen-Shannon and
Kolmogorov-Smirnov (on the binned CDFs).

Both compare the reference's bin shares with live counts over the same bins, so the live side
keeps only integer counts (no sketch): O(values) to update, exact at report time. An empty
bin gets a share of :data:`EMPTY_SHARE` on either side, as PSI needs (it is undefined at 0)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The share an empty bin is taken to have (1e-4: the usual choice; it bounds one empty bin's
#: PSI term near 0.7 when the other side holds 10 %).
EMPTY_SHARE = 1e-4


def _shares(values: Sequence[float] | np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    total = array.sum()
    if total <= 0:
        raise ValueError("a distribution needs a positive total")
    return array / total


def psi(reference: Sequence[float] | np.ndarray, live: Sequence[float] | np.ndarray) -> float:
    """Population stability index of ``live`` against ``reference`` (shares or counts, same bins):
    sum of (live - ref) * ln(live / ref). 0.1 is usually read as 'watch', 0.25 as 'act'."""
    expected = np.maximum(_shares(reference), EMPTY_SHARE)
    actual = np.maximum(_shares(live), EMPTY_SHARE)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def js_distance(reference: Sequence[float] | np.ndarray, live: Sequence[float] | np.ndarray) -> float:
    """Jensen-Shannon distance in base 2 (the square root of the divergence): 0 for the same
    distribution, 1 for distributions with no bin in common."""
    p, q = _shares(reference), _shares(live)
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        held = a > 0
        return float(np.sum(a[held] * np.log2(a[held] / m[held])))

    divergence = max(0.0, (kl(p) + kl(q)) / 2)
    return float(min(1.0, np.sqrt(divergence)))


def ks_distance(reference: Sequence[float] | np.ndarray, live: Sequence[float] | np.ndarray) -> float:
    """Kolmogorov-Smirnov distance on binned CDFs: the largest gap between the two cumulative
    shares at the bins' edges (underflow first, overflow last). Only for ordered bins (a value
    histogram, confidence), not for class shares. The edges are the only places compared, so it
    is at most the KS statistic of the raw values (equal when the largest gap falls on an edge)."""
    gaps = np.abs(np.cumsum(_shares(reference)) - np.cumsum(_shares(live)))
    return float(min(1.0, gaps.max()))


def closed_edges(edges: Sequence[float]) -> np.ndarray:
    """``edges`` as float64 with the last one nudged up, so the reference maximum falls in the
    last bin (closed on the right) and not in the overflow: what :func:`bin_counts` takes."""
    closed = np.asarray(edges, dtype=np.float64).copy()
    closed[-1] = np.nextafter(closed[-1], np.inf)
    return closed


def bin_counts(closed: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Counts of ``values`` over the bins of :func:`closed_edges`: underflow, each
    [e[i], e[i+1]), overflow; len(closed) + 1 counts. One searchsorted and one bincount."""
    index = np.searchsorted(closed, values.ravel(), side="right")
    return np.bincount(index, minlength=len(closed) + 1)
