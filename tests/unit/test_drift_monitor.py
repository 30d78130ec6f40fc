"""The agent's drift monitor (agent/drift/monitor.py) with a fake model set: it taps each model's
server once, samples 1 in N past 100 answers a second, counts NaN/Inf refusals by the model's
input names, and starts over when a model loads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
from edgesdk.agent.drift.monitor import RETUNE_EVERY, DriftMonitor, watch_drift
from edgesdk.agent.nonfinite import nonfinite_error


class _Models:
    def __init__(self, *names: str) -> None:
        self.default_server = SimpleNamespace(taps=[], model=None)
        self._entries = {n: self._entry(n) for n in names}

    @staticmethod
    def _entry(name: str) -> Any:
        model = SimpleNamespace(
            bundle_sha256=None, signature=SimpleNamespace(inputs=[SimpleNamespace(name=f"{name}-input")])
        )
        store = SimpleNamespace(slot_info=lambda slot: None)
        return SimpleNamespace(name=name, server=SimpleNamespace(taps=[], model=model), store=store)

    def entries(self) -> list[Any]:
        return list(self._entries.values())

    def entry(self, name: str) -> Any:
        return self._entries[name]


def _answer(monitor: DriftMonitor, name: str, count: int) -> None:
    feeds, outputs = {f"{name}-input": np.arange(4, dtype=np.float32)}, {"y": np.ones(2, np.float32)}
    for _ in range(count):
        monitor.tap(name, feeds, outputs, "v")


def test_watching_taps_each_server_once_and_feeds_telemetry() -> None:
    models, events, metrics = _Models("digits", "kws"), SimpleNamespace(), SimpleNamespace()
    events.subscribe = lambda fn: setattr(events, "handler", fn)
    metrics.attach_quality = lambda reports, readouts=None: setattr(metrics, "reports", reports)
    monitor = watch_drift(models, events, metrics)
    for name in ("digits", "kws", "kws"):  # each model's server tapped when it loads, once
        events.handler("model_loaded", {"model": name})
    assert [len(e.server.taps) for e in models.entries()] == [1, 1]
    _answer(monitor, "kws", 3)
    reports = metrics.reports()
    assert reports["kws"].samples == 3 and not reports["kws"].reference
    assert "digits" not in reports  # answered nothing: no report, its window goes on


def test_a_busy_model_is_sampled_one_in_n_without_waiting_for_a_report() -> None:
    # An agent with no fleet never reports: the tap must measure the rate itself.
    monitor = DriftMonitor(_Models("digits"))
    _answer(monitor, "digits", RETUNE_EVERY)  # far faster than MAX_SAMPLED_RPS, nothing sampled yet
    sampled = monitor._models["digits"]
    assert sampled.every == 1
    _answer(monitor, "digits", 4 * RETUNE_EVERY)
    assert sampled.every > 1
    assert monitor.reports()["digits"].samples < 2 * RETUNE_EVERY  # counted 1 in N after the first retune


def test_a_quiet_model_is_counted_whole() -> None:
    clock = iter(range(0, 10_000, 10))  # 10 s between answers: 0.1 answers a second
    with mock.patch("edgesdk.agent.drift.monitor.time.monotonic", lambda: float(next(clock))):
        monitor = DriftMonitor(_Models("digits"))
        _answer(monitor, "digits", 3 * RETUNE_EVERY)
    assert monitor._models["digits"].every == 1 and monitor.reports()["digits"].samples == 3 * RETUNE_EVERY


def test_nonfinite_refusals_count_for_the_model_with_that_input() -> None:
    monitor = DriftMonitor(_Models("digits", "kws"))
    monitor.reports()  # the windows start (and read the refusals so far)
    nonfinite_error("kws-input")
    nonfinite_error("kws-input")
    reports = monitor.reports()
    assert reports["kws"].nonfinite == 2 and "digits" not in reports
    assert "kws" not in monitor.reports()  # counted once: nothing since, no report
