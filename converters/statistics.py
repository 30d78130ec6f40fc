"""Gates that know how much data they saw: confidence bounds, sample counts, disjoint data sets.

A top-1 agreement of 21/22 is 95.5 %, but the agreement on the next thousand inputs could well
be 85 %: a gate on the point estimate passes or fails by chance on small data. So the gate is
read on a one-sided lower confidence bound (95 %): the Wilson score bound for an agreement (a
proportion); a per-sample figure's tail (below) gets an order-statistic bound. A variant whose point estimate
holds the gate but whose bound does not is *inconclusive*: more validation samples would tell.

A per-sample figure that a user relies on sample by sample (every embedding, every landmark) is
judged on its tail, not its mean: a mean cosine of 0.995 can hide a sentence at 0.9887. With
fewer than TAIL_MIN_SAMPLES samples the figure is the worst sample; from there the 5th
percentile (95th for an error), with a distribution-free 95 % bound (an order statistic); the
mean is reported beside it. Agreements (0/1 per sample) keep the Wilson bound.

Calibration data that also appears in the validation set makes the validation flatter the
quantization (the ranges were fitted on those very samples), so samples are hashed and an
overlap is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import UsageError

# The per-output readings live in the shared core, where the device agent's golden check reads
# them too; their names stay importable from here.
from edgesdk.quality.tail_statistics import (
    TAIL_MIN_SAMPLES,
    TAIL_PERCENT,
    Z_95,
    OutputReading,
    Verdict,
    agreement_reading,
    order_statistic_rank,
    samples_needed_for_agreement,
    tail_reading,
    wilson_lower,
    worst_case_reading,
)

__all__ = [
    "TAIL_MIN_SAMPLES",
    "TAIL_PERCENT",
    "Z_95",
    "OutputReading",
    "Verdict",
    "agreement_reading",
    "order_statistic_rank",
    "samples_needed_for_agreement",
    "tail_reading",
    "wilson_lower",
    "worst_case_reading",
]

BOOTSTRAP_ROUNDS = 2000


def bootstrap_mean_lower(values: np.ndarray, rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0) -> float:
    """5th percentile of the bootstrap distribution of the mean (one-sided 95 % lower bound)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0:
        return 0.0
    if values.size == 1:
        return float(values[0])
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(rounds, values.size))].mean(axis=1)
    return float(np.percentile(means, 5))


def cluster_bootstrap_lower(
    values: np.ndarray, groups: np.ndarray, rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0
) -> float:
    """Lower 95 % bound of the mean when samples come in correlated groups (views of one photo):
    whole groups are resampled, so the bound is as wide as the number of *groups* warrants."""
    values = np.asarray(values, dtype=np.float64).ravel()
    groups = np.asarray(groups).ravel()
    names, index = np.unique(groups, return_inverse=True)
    if names.size <= 1:
        return float(values.mean()) if values.size else 0.0
    sums = np.bincount(index, weights=values, minlength=names.size)
    counts = np.bincount(index, minlength=names.size).astype(np.float64)
    picks = np.random.default_rng(seed).integers(0, names.size, size=(rounds, names.size))
    means = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
    return float(np.percentile(means, 5))


@dataclass(frozen=True)
class GateReading:
    """The gate read on a confidence bound."""

    value: float  # point estimate (the metric as before)
    lower_bound: float | None  # None for max_abs (a worst case, not a mean)
    verdict: Verdict
    samples: int
    #: Samples at which this point estimate would pass on its bound (agreement only; 0: never).
    samples_needed: int | None
    how: str

    def sentence(self, metric: str, gate: float) -> str:
        if self.lower_bound is None:
            return f"{metric} {self.value:.6g} vs gate {gate:g} on {self.samples} samples"
        text = (
            f"{metric} {self.value:.4g} (95% lower bound {self.lower_bound:.4g}, {self.how}) on "
            f"{self.samples} samples vs gate {gate:g}: {self.verdict}"
        )
        if self.verdict == "inconclusive" and self.samples_needed:
            text += f"; about {self.samples_needed} samples would tell at this agreement"
        return text


def per_sample(metric: str, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per-sample agreement (0/1, first output) or cosine (worst output per sample)."""
    rows = []
    for name, ref in reference.items():
        out = np.asarray(outputs[name], dtype=np.float64).reshape(ref.shape[0], -1)
        want = np.asarray(ref, dtype=np.float64).reshape(ref.shape[0], -1)
        if metric == "top1":
            return (out.argmax(1) == want.argmax(1)).astype(np.float64)
        dot = (out * want).sum(1)
        norms = np.linalg.norm(out, axis=1) * np.linalg.norm(want, axis=1)
        rows.append(np.where(norms > 0, dot / np.maximum(norms, 1e-30), 1.0))
    return np.min(np.stack(rows), axis=0)


def read_gate(metric: str, value: float, gate: float, samples: np.ndarray | None) -> GateReading:
    """Point estimate ``value`` (the existing metric) plus its bound and verdict."""
    if metric == "max_abs" or samples is None or samples.size == 0:
        passed = value <= gate if metric == "max_abs" else value >= gate
        count = 0 if samples is None else int(samples.size)
        return GateReading(value, None, "pass" if passed else "fail", count, None, "worst case")
    count = int(samples.size)
    if metric == "top1":
        lower = wilson_lower(int(round(samples.sum())), count)
        how = "Wilson"
        needed: int | None = samples_needed_for_agreement(gate, value)
    else:
        lower = bootstrap_mean_lower(samples)
        how = f"bootstrap of the mean, {BOOTSTRAP_ROUNDS} rounds"
        needed = None
    if value < gate:
        verdict: Verdict = "fail"
    elif lower >= gate:
        verdict = "pass"
    else:
        verdict = "inconclusive"
    return GateReading(value, lower, verdict, count, needed, how)


def sample_hashes(data: Mapping[str, np.ndarray]) -> list[str]:
    """One SHA-256 per sample over every input's bytes (dtype and shape included)."""
    names = sorted(data)
    count = int(data[names[0]].shape[0]) if names else 0
    hashes = []
    for i in range(count):
        digest = hashlib.sha256()
        for name in names:
            row = np.ascontiguousarray(data[name][i])
            digest.update(f"{name}:{row.dtype.str}:{row.shape};".encode())
            digest.update(row.tobytes())
        hashes.append(digest.hexdigest())
    return hashes


def check_disjoint(calibration: Mapping[str, np.ndarray], validation: Mapping[str, np.ndarray]) -> int:
    """Raise UsageError when validation repeats calibration samples; return the duplicates *within*
    validation (repeated samples count once for the statistics, so they are reported)."""
    cal = set(sample_hashes(calibration))
    val = sample_hashes(validation)
    shared = [i for i, h in enumerate(val) if h in cal]
    if shared:
        raise UsageError(
            f"validation data repeats {len(shared)} of its {len(val)} samples from the calibration data "
            f"(first at validation index {shared[0]}); a gate measured on samples the quantizer was "
            "calibrated on flatters it: give disjoint sets"
        )
    return len(val) - len(set(val))


def minimum_samples_sentence(metric: str, gate: float) -> str:
    """What ``edgesdk convert`` tells before it starts: how much data the gate needs."""
    if metric == "top1":
        perfect = samples_needed_for_agreement(gate, 1.0)
        margin = samples_needed_for_agreement(gate, min(1.0, gate + (1 - gate) / 2))
        return (
            f"gate top-1 ≥ {gate:g} on a 95% lower bound needs ≥ {perfect} validation samples even if none changes, "
            f"≈{margin} if {1 - min(1.0, gate + (1 - gate) / 2):.1%} change"
        )
    if metric == "cosine":
        return (
            f"gate cosine ≥ {gate:g} is read on the tail of the per-sample cosines: the worst sample under "
            f"{TAIL_MIN_SAMPLES} samples, else the {TAIL_PERCENT:g}th percentile, whose 95% lower bound needs ≥ "
            "59 samples (the worst sample stands in below); the mean is shown beside it"
        )
    return f"gate max_abs ≤ {gate:g} is a worst case over the validation samples (no bound)"
