"""How far the new model's answers agree with the previous release's on the same live requests.

Each output is judged with the metric the converter and the install's golden check use for it
(:func:`edgesdk.agent.ota.smoke.device_metric`: chosen from the output's name, shape and values,
the bundle's golden metric where it is that kind) and read with the quality module's bounds:

* ``top1`` / ``ctc`` (a class, a decoded text): the share of samples that agree, read on its
  one-sided 95 % Wilson lower bound;
* ``abs`` / ``max_abs`` (an error in the output's units): the share of samples within the
  output's tolerance, read the same way (an error has no 0..1 scale of its own to hold a
  minimum agreement against);
* ``cosine`` / ``iou`` (a similarity): its tail, the 5th percentile with its distribution-free
  95 % lower bound (``tail_reading``).

The previous release is the reference: it served (and committed) before, so its answer is the
one the new model must keep.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from edgesdk.agent.ota.smoke import device_metric

from edgesdk.quality.output_metrics import AGREEMENT_KINDS, ERROR_KINDS, OutputMetric, per_sample
from edgesdk.quality.tail_statistics import tail_reading, wilson_lower

#: Judge agreement only on this many compared samples (fewer: a handful of requests decide). At
#: 30 samples that all agree the Wilson lower bound is 0.917: a minimum of 0.9 can pass, one of
#: 0.95 needs 52 (docs/ota.md, "Shadow agreement").
MIN_SHADOW_SAMPLES = 30
#: Per-sample figures kept per continuous output (a reservoir beyond it): bounded memory on a
#: busy device; the tail's bound is then read on a uniform sample of the window.
KEPT_VALUES = 20_000


@dataclass(frozen=True)
class OutputAgreement:
    """One output's agreement so far: its figure, the bound it is judged on, and how many samples."""

    name: str
    kind: str
    value: float
    lower_bound: float
    upper_bound: float | None  # agreement rates only: the early-failure test
    samples: int

    def sentence(self) -> str:
        return f"{self.value:.2f} (lower bound {self.lower_bound:.2f} over {self.samples} requests)"


class OutputTally:
    """The per-sample figures of one output: agree counts, or kept values for a tail."""

    def __init__(self, name: str, metric: OutputMetric) -> None:
        self.name = name
        self.metric = metric
        self.samples = 0
        self.agreed = 0
        self.values: list[float] = []
        self._random = random.Random(0)

    @property
    def counted(self) -> bool:
        """True: judged as a share of samples that agree (Wilson); False: on its tail."""
        return self.metric.kind in AGREEMENT_KINDS or self.metric.kind in ERROR_KINDS

    def add(self, values: np.ndarray) -> None:
        threshold = float(self.metric.threshold or 0.0)
        for value in np.asarray(values, dtype=np.float64).ravel():
            self.samples += 1
            if self.metric.kind in ERROR_KINDS:
                self.agreed += int(value <= threshold)
            elif self.metric.kind in AGREEMENT_KINDS:
                self.agreed += int(value >= 0.5)
            elif len(self.values) < KEPT_VALUES:
                self.values.append(float(value))
            else:  # reservoir sampling: every sample of the window equally likely to be kept
                slot = self._random.randrange(self.samples)
                if slot < KEPT_VALUES:
                    self.values[slot] = float(value)

    def disagree(self, rows: int) -> None:
        """Rows whose output could not be compared (another shape, missing): the worst figure."""
        worst = {"cosine": -1.0, "iou": 0.0, "top1": 0.0, "ctc": 0.0}.get(self.metric.kind, np.inf)
        self.add(np.full(max(rows, 1), worst))

    def reading(self, minimum: float | None) -> OutputAgreement:
        if self.counted:
            n, agreed = self.samples, self.agreed
            upper = 1.0 - wilson_lower(n - agreed, n) if n else 1.0
            return OutputAgreement(
                self.name, self.metric.kind, agreed / n if n else 0.0, wilson_lower(agreed, n), upper, n
            )
        gate = minimum if minimum is not None else float(self.metric.threshold or 0.99)
        tail = tail_reading(np.asarray(self.values), gate)
        bound = tail.lower_bound if tail.lower_bound is not None else tail.value
        return OutputAgreement(self.name, self.metric.kind, tail.value, float(bound), None, self.samples)


class Agreement:
    """Every output's tally, fed by the shadow worker, read by probation (thread-safe)."""

    def __init__(self, manifest: Any) -> None:
        self.manifest = manifest  # the new bundle's: its golden metric names the kind and gate
        self.tallies: dict[str, OutputTally] = {}
        self._lock = threading.Lock()

    def compare(self, outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> None:
        """One request: the new model's ``outputs`` against the previous release's ``reference``."""
        for name, want in reference.items():
            want = np.asarray(want)
            want = want.reshape(1, -1) if want.ndim == 0 else want
            got = outputs.get(name)
            with self._lock:
                tally = self.tallies.get(name)
                if tally is None:
                    metric = device_metric(name, want, len(reference) == 1, self.manifest)
                    tally = self.tallies[name] = OutputTally(name, metric)
                if got is None or np.asarray(got).size != want.size:
                    tally.disagree(len(want))
                    continue
                tally.add(per_sample(tally.metric, np.asarray(got).reshape(want.shape), want))

    def worst(self, minimum: float | None) -> OutputAgreement | None:
        """The output with the lowest bound (the one that decides), or None before any sample."""
        readings = self.readings(minimum)
        return min(readings, key=lambda r: r.lower_bound) if readings else None

    def readings(self, minimum: float | None) -> list[OutputAgreement]:
        """Every output's reading so far (those with samples), by name."""
        with self._lock:
            return [self.tallies[name].reading(minimum) for name in sorted(self.tallies) if self.tallies[name].samples]
