"""Probation criteria and the smoke-test comparison, with a fake server (no runtime)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import numpy as np
import pytest
from edgesdk.agent.ota.machine import ProbationFailed, UpdateCancelled
from edgesdk.agent.ota.probation import ProbationMonitor
from edgesdk.agent.ota.smoke import passes, score, split_golden

from edgesdk.errors import RuntimeBackendError
from edgesdk.schemas.messages import HealthCriteria

GOLDEN_IN = {"image": np.arange(8, dtype=np.float32).reshape(8, 1)}
GOLDEN_OUT = {"logits": np.eye(8, 10, dtype=np.float32)}


class FakeServer:
    """Calls its observe/count_error hooks like ModelServer.infer does."""

    def __init__(self, *, latency_s: float = 0.0, fail_every: int = 0, wrong: bool = False) -> None:
        self.observe = lambda variant, seconds: None
        self.count_error = lambda kind: None
        self.latency_s = latency_s
        self.fail_every = fail_every
        self.wrong = wrong
        self.calls = 0

    def infer(self, name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            self.count_error("runtime")
            raise RuntimeBackendError("boom")
        row = int(feeds["image"][0, 0])
        logits = np.roll(GOLDEN_OUT["logits"][row : row + 1], 1 if self.wrong else 0, axis=1)
        self.observe("v", self.latency_s)
        return {"logits": logits}


def watch(server: FakeServer, health: HealthCriteria, *, traffic: int = 0) -> str:
    monitor = ProbationMonitor(
        server, "m", (GOLDEN_IN, GOLDEN_OUT, "top1"), probe_interval_s=0.0, check_interval_s=0.001
    )
    for _ in range(traffic):  # real traffic before the window is judged
        server.observe("v", server.latency_s)
    return monitor.watch(health, datetime.now(timezone.utc), lambda: False)


def test_healthy_model_passes_its_window() -> None:
    summary = watch(
        FakeServer(latency_s=0.001), HealthCriteria(probation_s=0.2, p95_latency_ms=50, max_output_drift=0.1)
    )
    assert "probation passed" in summary


def test_slo_breach_fails() -> None:
    with pytest.raises(ProbationFailed, match="p95 latency 80.00 ms > SLO 10"):
        watch(FakeServer(latency_s=0.08), HealthCriteria(probation_s=5, p95_latency_ms=10))


def test_error_rate_fails() -> None:
    with pytest.raises(ProbationFailed, match="error rate"):
        watch(FakeServer(fail_every=3), HealthCriteria(probation_s=5, max_error_rate=0.05))


def test_output_drift_fails() -> None:
    with pytest.raises(ProbationFailed, match="output drift 1.0000 > max_output_drift 0.1"):
        watch(FakeServer(wrong=True), HealthCriteria(probation_s=5, max_output_drift=0.1))


def test_client_errors_do_not_count_and_hooks_are_restored() -> None:
    server = FakeServer()
    original = server.observe
    monitor = ProbationMonitor(server, "m", None, check_interval_s=0.001)
    start = time.time()

    def bad_requests() -> bool:
        server.count_error("bad_input")  # the caller's fault, not the model's
        return time.time() - start > 5

    monitor.watch(HealthCriteria(probation_s=0.1, max_error_rate=0.0), datetime.now(timezone.utc), bad_requests)
    assert server.observe is original
    with pytest.raises(UpdateCancelled):
        monitor.watch(HealthCriteria(probation_s=5), datetime.now(timezone.utc), lambda: True)


def test_smoke_scores() -> None:
    want = np.eye(4, dtype=np.float32)
    assert score("top1", want, want) == 1.0
    assert score("top1", np.roll(want, 1, axis=1), want) == 0.0
    assert score("cosine", want * 3, want) == pytest.approx(1.0)
    assert score("max_abs", want + 0.5, want) == pytest.approx(0.5)
    assert passes("max_abs", 0.01, 0.02) and not passes("max_abs", 0.03, 0.02)
    assert passes("top1", 0.99, 0.98) and not passes("top1", 0.9, 0.98)
    inputs, expected = split_golden({"image": want, "output:logits": want})
    assert list(inputs) == ["image"] and list(expected) == ["logits"]
