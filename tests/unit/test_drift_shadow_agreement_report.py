"""The telemetry's quality report carries the running shadow's agreement (issue 41): the drift
monitor finds a probation's ShadowRunner on the server's taps and reports each output's figure as
probation reads it; no shadow running, no figure."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
from edgesdk.agent.drift.monitor import DriftMonitor
from edgesdk.agent.shadow.agreement import Agreement
from edgesdk.agent.shadow.runner import ShadowRunner

from edgesdk.schemas.messages import ModelQuality

MANIFEST = SimpleNamespace(golden=SimpleNamespace(metric="top1", gate=0.99))


def _logits(label: int) -> dict[str, np.ndarray]:
    out = np.zeros((1, 10), np.float32)
    out[0, label] = 5.0
    return {"logits": out}


class _Previous:
    """The previous release: always answers class 3."""

    def infer(self, model_name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return _logits(3)


def _models() -> Any:
    model = SimpleNamespace(bundle_sha256=None, signature=SimpleNamespace(inputs=[SimpleNamespace(name="x")]))
    entry = SimpleNamespace(
        name="digits", server=SimpleNamespace(taps=[], model=model), store=SimpleNamespace(slot_info=lambda s: None)
    )
    return SimpleNamespace(default_server=SimpleNamespace(taps=[]), entries=lambda: [entry], entry=lambda n: entry)


def test_quality_report_carries_the_running_shadows_agreement_per_output() -> None:
    models = _models()
    monitor = DriftMonitor(models)
    runner = ShadowRunner("digits", _Previous(), Agreement(MANIFEST), rate=1.0, minimum=0.9).start()
    models.default_server.taps.append(runner.tap)  # where start_shadow puts it (ShadowDevice.taps)
    try:
        for i in range(40):  # 36 of 40 answers keep the previous release's class
            runner.tap("digits", {"x": np.zeros(1, np.float32)}, _logits(3 if i < 36 else 4), "v")
            deadline = time.monotonic() + 10
            while runner.compared < i + 1:
                assert time.monotonic() < deadline, "the shadow worker did not compare"
                time.sleep(0.005)
        report = monitor.reports()["digits"]
    finally:
        runner.stop()
    figure = report.agreement["logits"]
    gate = runner.agreement.worst(0.9)  # what probation judges
    assert (figure.kind, figure.samples, figure.minimum) == ("top1", 40, 0.9)
    assert figure.value == 0.9 and figure.lower_bound == gate.lower_bound < 0.9
    sent = ModelQuality.model_validate_json(report.model_dump_json())  # as telemetry carries it
    assert sent.agreement == report.agreement
    models.default_server.taps.remove(runner.tap)  # probation over: the tap is taken off
    monitor.tap("digits", {"x": np.zeros(1, np.float32)}, _logits(3), "v")  # an answer: a report
    assert monitor.reports()["digits"].agreement is None
