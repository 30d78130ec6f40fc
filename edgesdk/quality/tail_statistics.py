"""How a gate reads one output's per-sample figures: its tail, an agreement, or a worst case.

Shared by the converters (validation on the host) and the device agent (the install's golden
check), so that both judge an output the same way; numpy only. A per-sample figure a user relies
on sample by sample (every embedding, every landmark) is judged on its tail, not its mean: with
fewer than TAIL_MIN_SAMPLES samples the worst sample, from there the 5th percentile (95th for an
error) with a distribution-free 95 % bound (an order statistic); agreements (0/1 per sample) are
read on a one-sided Wilson lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: One-sided 95 % normal quantile.
Z_95 = 1.6448536269514722

Verdict = Literal["pass", "fail", "inconclusive"]


def wilson_lower(successes: int, total: int, z: float = Z_95) -> float:
    """One-sided lower Wilson score bound of a proportion."""
    if total <= 0:
        return 0.0
    p = successes / total
    denominator = 1 + z * z / total
    centre = p + z * z / (2 * total)
    margin = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return max(0.0, (centre - margin) / denominator)


def samples_needed_for_agreement(gate: float, observed: float = 1.0, z: float = Z_95, limit: int = 1_000_000) -> int:
    """Fewest samples at which agreement ``observed`` has a Wilson lower bound ≥ ``gate``.

    With ``observed`` = 1.0 (no sample changes) this is the least data that can ever pass;
    0 means the gate cannot be reached at that agreement (observed ≤ gate).
    """
    if observed <= gate:
        return 0
    if observed >= 1.0:
        # n / (n + z²) ≥ gate  ⇔  n ≥ gate z² / (1 − gate)
        return math.ceil(gate * z * z / (1 - gate)) if gate < 1 else 0
    n = 1
    while n <= limit:
        if wilson_lower(round(observed * n), n, z) >= gate:
            return n
        n *= 2
    low, high = n // 2, n
    while low + 1 < high:
        mid = (low + high) // 2
        if wilson_lower(round(observed * mid), mid, z) >= gate:
            high = mid
        else:
            low = mid
    return high if high <= limit else 0


#: Below this many samples a tail gate reads the worst sample; from it, the TAIL_PERCENT percentile.
TAIL_MIN_SAMPLES = 20
TAIL_PERCENT = 5.0


@dataclass(frozen=True)
class OutputReading:
    """One output's gate: the figure it is judged on (tail or agreement), its bound and the mean."""

    value: float
    mean: float
    lower_bound: float | None  # for an error (lower is better) the *upper* bound
    verdict: Verdict
    samples: int
    statistic: str  # "agreement", "worst sample", "5th percentile", "worst case"
    samples_needed: int | None = None


def order_statistic_rank(count: int, share: float = TAIL_PERCENT / 100, confidence: float = 0.95) -> int:
    """Largest k with P(Binomial(count, share) ≥ k) ≥ confidence: the k-th smallest sample is then
    a distribution-free lower bound of the ``share`` quantile; 0 when none is (too few samples)."""
    below = 0.0  # P(Binomial < k), built up term by term
    rank = 0
    for k in range(1, count + 1):
        below += math.comb(count, k - 1) * share ** (k - 1) * (1 - share) ** (count - k + 1)
        if 1 - below < confidence:
            break
        rank = k
    return rank


def tail_reading(values: np.ndarray, gate: float, lower_is_better: bool = False) -> OutputReading:
    """The low tail of a per-sample figure (the high tail of an error) against ``gate``."""
    values = np.asarray(values, dtype=np.float64).ravel()
    count = int(values.size)
    if count == 0:
        return OutputReading(float("nan"), float("nan"), None, "fail", 0, "no samples")
    mean = float(values.mean())
    # A NaN sample is the worst there is (np.sort would put it last, out of the tail's sight).
    values = np.where(np.isnan(values), np.inf if lower_is_better else -np.inf, values)
    ordered = np.sort(-values if lower_is_better else values)  # worst first
    if count < TAIL_MIN_SAMPLES:
        figure, bound, statistic = ordered[0], ordered[0], "worst sample"
    else:
        figure = float(np.percentile(ordered, TAIL_PERCENT))
        rank = order_statistic_rank(count)
        bound = ordered[rank - 1] if rank else ordered[0]
        statistic = f"{100 - TAIL_PERCENT:g}th percentile" if lower_is_better else f"{TAIL_PERCENT:g}th percentile"
        if not rank:  # no order statistic is a 95 % bound yet: the worst sample stands in, stricter
            statistic += ", the worst sample as its bound"
    sign = -1.0 if lower_is_better else 1.0
    figure, bound = sign * float(figure) + 0.0, sign * float(bound) + 0.0  # + 0.0: no "-0" in a report
    holds = (lambda x: x <= gate) if lower_is_better else (lambda x: x >= gate)
    verdict: Verdict = "fail" if not holds(figure) else "pass" if holds(bound) else "inconclusive"
    return OutputReading(figure, mean, bound, verdict, count, statistic)


def agreement_reading(values: np.ndarray, gate: float) -> OutputReading:
    """A 0/1 per-sample agreement: the share that agrees, read on its Wilson lower bound."""
    values = np.asarray(values, dtype=np.float64).ravel()
    count = int(values.size)
    value = float(values.mean()) if count else 0.0
    lower = wilson_lower(int(round(values.sum())), count)
    verdict: Verdict = "fail" if value < gate else "pass" if lower >= gate else "inconclusive"
    needed = samples_needed_for_agreement(gate, value)
    return OutputReading(value, value, lower, verdict, count, "agreement", needed)


def worst_case_reading(values: np.ndarray, limit: float) -> OutputReading:
    """``max_abs``: the largest difference over every sample, no bound (a worst case already)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    value = float(values.max()) if values.size else 0.0
    mean = float(values.mean()) if values.size else 0.0
    return OutputReading(value, mean, None, "pass" if value <= limit else "fail", int(values.size), "worst case")
