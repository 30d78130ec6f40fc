"""Probation: after activation the new model must hold its deployment's health criteria over a
window, or it is rolled back.

Evidence comes from two places: the device's real traffic (the monitor taps the ModelServer's
``observe``/``count_error`` hooks while probation runs, so only requests served by the new
model count) and its own probe requests (golden inputs, a few per second, which also measure
output drift against the golden outputs). Criteria: error rate, p95 latency SLO, output drift;
restarts are counted by the state machine (a crash loop rolls back there).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np
from edgesdk.agent.ota.machine import ProbationFailed, UpdateCancelled
from edgesdk.agent.ota.smoke import score

from edgesdk.errors import EdgeSDKError
from edgesdk.schemas.messages import HealthCriteria

if TYPE_CHECKING:
    from edgesdk.agent.shadow.check import ShadowCheck

log = logging.getLogger(__name__)

#: Error kinds that are the model's (or the device's) fault; bad requests are not.
MODEL_ERROR_KINDS = frozenset({"runtime", "timeout", "overload"})
#: Judge rates and percentiles only on this many requests, or one slow request decides.
MIN_SAMPLES = 20


class HealthTap:
    """Counts what the server does while installed; uninstall restores its hooks."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.latencies: list[float] = []
        self.errors = 0
        self._lock = threading.Lock()
        self._observe = server.observe
        self._count_error = server.count_error

        def observe(variant_id: str, seconds: float) -> None:
            self._observe(variant_id, seconds)
            with self._lock:
                self.latencies.append(seconds)

        def count_error(kind: str) -> None:
            self._count_error(kind)
            if kind in MODEL_ERROR_KINDS:
                with self._lock:
                    self.errors += 1

        server.observe = observe
        server.count_error = count_error

    def uninstall(self) -> None:
        self.server.observe = self._observe
        self.server.count_error = self._count_error

    def figures(self) -> tuple[int, int, float | None]:
        """(requests, model errors, p95 ms or None)."""
        with self._lock:
            samples = np.asarray(self.latencies, dtype=np.float64)
            errors = self.errors
        p95 = float(np.percentile(samples, 95) * 1000.0) if samples.size >= MIN_SAMPLES else None
        return int(samples.size) + errors, errors, p95


class ProbationMonitor:
    """Watches one activated model until its window ends or a criterion breaks."""

    def __init__(
        self,
        server: Any,
        model_name: str,
        golden: tuple[dict[str, np.ndarray], dict[str, np.ndarray], str] | None,
        *,
        probe_interval_s: float = 0.25,
        check_interval_s: float = 0.1,
        clock: Callable[[], float] = time.time,
        shadow: ShadowCheck | None = None,
    ) -> None:
        self.server = server
        self.model_name = model_name
        self.golden = golden
        self.probe_interval_s = probe_interval_s
        self.check_interval_s = check_interval_s
        self.clock = clock
        self.probes = 0
        self.drift_scores: list[float] = []
        # The previous release run beside on sampled live requests (agent/shadow): min_agreement.
        self.shadow = shadow

    def watch(self, health: HealthCriteria, started: datetime, cancelled: Callable[[], bool]) -> str:
        """Return a summary when the window passes; raise ProbationFailed on a breach."""
        end = _epoch(started) + health.probation_s
        tap = HealthTap(self.server)
        next_probe = 0.0
        try:
            while True:
                now = self.clock()
                if cancelled():
                    raise UpdateCancelled("cancelled during probation")
                if now >= next_probe and self.golden is not None:
                    self._probe()
                    next_probe = now + self.probe_interval_s
                self._judge(health, tap)
                if now >= end:
                    return self._passed(tap)
                time.sleep(min(self.check_interval_s, max(0.0, end - now)))
        finally:
            tap.uninstall()

    def _passed(self, tap: HealthTap) -> str:
        """The window is over: the shadow's final word, then the line that says what passed."""
        shadow = self.shadow
        breach = shadow.breach(final=True) if shadow is not None else None
        if breach is not None:
            raise ProbationFailed(breach)
        requests, errors, p95 = tap.figures()
        line = f"probation passed: {requests} requests, {errors} errors, p95 {_ms(p95)}"
        return f"{line}; {shadow.summary()}" if shadow is not None else line

    def _probe(self) -> None:
        """One golden row through the real serving path; its latency and errors land in the tap."""
        if self.golden is None:
            return
        if self.shadow is not None:
            with self.shadow.quiet():  # a probe is not live traffic: never shadowed
                self._probe_once(self.golden)
        else:
            self._probe_once(self.golden)

    def _probe_once(self, golden: tuple[dict[str, np.ndarray], dict[str, np.ndarray], str]) -> None:
        inputs, expected, metric = golden
        self.probes += 1
        rows = {v.shape[0] if v.ndim else 0 for v in inputs.values()}
        if len(rows) == 1 and min(rows) > 1:
            row = self.probes % min(rows)
            feeds = {k: v[row : row + 1] for k, v in inputs.items()}
            wants = {k: v[row : row + 1] for k, v in expected.items()}
        else:
            # One sample in the model's own layout (a 0-d input, a state batched on axis 1):
            # axis 0 is not a row to slice, so the golden set is probed whole.
            feeds, wants = inputs, expected
        try:
            outputs = self.server.infer(self.model_name, feeds)
        except EdgeSDKError:
            return  # counted by the tap (count_error) when it is the model's fault
        for name, want in wants.items():
            if name in outputs:
                self.drift_scores.append(score(metric, outputs[name], want))

    def drift(self, metric: str) -> float | None:
        """top1/cosine: 1 - mean agreement; max_abs: the largest difference seen."""
        if len(self.drift_scores) < 1:
            return None
        if metric == "max_abs":
            return float(max(self.drift_scores))
        return float(1.0 - np.mean(self.drift_scores))

    def _judge(self, health: HealthCriteria, tap: HealthTap) -> None:
        requests, errors, p95 = tap.figures()
        if requests >= MIN_SAMPLES and errors / requests > health.max_error_rate:
            raise ProbationFailed(
                f"error rate {errors}/{requests} = {errors / requests:.3f} > max_error_rate {health.max_error_rate}"
            )
        if health.p95_latency_ms is not None and p95 is not None and p95 > health.p95_latency_ms:
            raise ProbationFailed(f"p95 latency {p95:.2f} ms > SLO {health.p95_latency_ms} ms ({requests} requests)")
        if health.max_output_drift is not None and self.golden is not None:
            drift = self.drift(self.golden[2])
            if drift is not None and len(self.drift_scores) >= 3 and drift > health.max_output_drift:
                raise ProbationFailed(f"output drift {drift:.4f} > max_output_drift {health.max_output_drift}")
        breach = self.shadow.breach(final=False) if self.shadow is not None else None
        if breach is not None:
            raise ProbationFailed(breach)


def _epoch(moment: datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"
