"""The probation shadow (agent/shadow): the sampler, the bound it is judged on, drops on a full
queue, the pressure skip, and a deployment that asks shadow_rate 1.0 of a busy device."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
from edgesdk.agent.governor.sensors import SensorReading
from edgesdk.agent.shadow.agreement import MIN_SHADOW_SAMPLES, Agreement
from edgesdk.agent.shadow.check import ShadowCheck
from edgesdk.agent.shadow.pressure import governor_pressure
from edgesdk.agent.shadow.runner import QUEUE_SIZE, ShadowRunner

from edgesdk.schemas.profile import Thermal

MANIFEST = SimpleNamespace(golden=SimpleNamespace(metric="top1", gate=0.99))


def logits(label: int) -> dict[str, np.ndarray]:
    out = np.zeros((1, 10), np.float32)
    out[0, label] = 5.0
    return {"logits": out}


class Reference:
    """The previous release: answers the label in feeds (a class index), after ``delay`` seconds."""

    def __init__(self, delay: float = 0.0, release: threading.Event | None = None) -> None:
        self.delay = delay
        self.release = release
        self.calls = 0

    def infer(self, model_name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        if self.release is not None:
            self.release.wait(10)
        time.sleep(self.delay)
        return logits(int(feeds["label"][0]))


def feed(label: int) -> dict[str, np.ndarray]:
    return {"label": np.array([label])}


def wait_for(predicate, timeout: float = 60.0) -> None:  # a thread a loaded machine may run late
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def check_after(agreeing: int, total: int, minimum: float | None) -> ShadowCheck:
    """A check whose worker compared ``total`` answers, ``agreeing`` of them the same class."""
    runner = ShadowRunner("digits", Reference(), Agreement(MANIFEST), rate=1.0).start()
    try:
        for i in range(total):
            runner.tap("digits", feed(3), logits(3 if i < agreeing else 4), "onnx-fp32")
            wait_for(lambda i=i: runner.compared == i + 1)
    finally:
        runner.stop()
    return ShadowCheck(minimum, runner, reference_release=1)


def test_shadow_sampler_takes_the_rate_share_of_its_own_models_live_requests() -> None:
    draws = iter([0.05, 0.5, 0.09, 0.95] * 25)
    runner = ShadowRunner("digits", Reference(), Agreement(MANIFEST), rate=0.1, draw=lambda: next(draws))
    for _ in range(100):
        runner.tap("digits", feed(1), logits(1), "v")
    runner.tap("other-model", feed(1), logits(1), "v")  # another model's answer: not this shadow's
    with runner.quiet():  # probation's own probes are not live traffic
        runner.tap("digits", feed(1), logits(1), "v")
    assert runner.seen == 100
    # Half the draws are under 0.1; the queue holds QUEUE_SIZE (no worker started), the rest drop.
    assert runner.sampled == QUEUE_SIZE and runner.dropped == 50 - QUEUE_SIZE


def test_shadow_agreement_below_the_minimum_fails_with_the_figure_and_its_bound() -> None:
    check = check_after(agreeing=48, total=60, minimum=0.9)
    reason = check.breach(final=True)
    assert reason is not None
    assert reason.startswith("shadow agreement 0.80 (lower bound 0.70 over 60 requests) < 0.9"), reason
    assert "logits: top1 against release 1" in reason
    # During the window it fails early only once even the upper bound is below the minimum.
    assert check.breach(final=False) == reason


def test_shadow_agreement_early_failure_waits_for_certainty() -> None:
    # 27 of 30 agree: 0.90 observed, upper bound above 0.9: not certain during the window...
    check = check_after(agreeing=27, total=MIN_SHADOW_SAMPLES, minimum=0.9)
    assert check.breach(final=False) is None
    # ...but at the window's end the lower bound must hold the minimum.
    assert "lower bound 0.77 over 30 requests" in (check.breach(final=True) or "")


def test_shadow_agreement_that_holds_passes_and_the_passed_line_says_so() -> None:
    check = check_after(agreeing=MIN_SHADOW_SAMPLES, total=MIN_SHADOW_SAMPLES, minimum=0.9)
    assert check.breach(final=True) is None  # Wilson lower bound 30/30 = 0.917 ≥ 0.9
    summary = check.summary()
    assert summary == (
        "shadow agreement 1.00 (lower bound 0.92 over 30 requests; logits: top1 against release 1; "
        "30 compared of 30 requests at rate 1)"
    )


def test_shadow_agreement_too_few_samples_fails_closed_only_at_the_end() -> None:
    check = check_after(agreeing=10, total=10, minimum=0.9)
    assert check.breach(final=False) is None
    reason = check.breach(final=True) or ""
    assert reason.startswith("shadow agreement not shown: 10 compared requests, at least 30 needed"), reason
    assert check_after(agreeing=10, total=10, minimum=None).breach(final=True) is None  # not asked: no verdict


def test_no_shadow_fails_closed_only_when_min_agreement_is_asked() -> None:
    asked = ShadowCheck(0.95, absent="the previous release's slot is gone")
    assert asked.breach(final=False) == (
        "shadow agreement cannot be checked (the previous release's slot is gone); the deployment asks "
        "min_agreement 0.95"
    )
    informational = ShadowCheck(None, absent="the previous release's slot is gone")
    assert informational.breach(final=True) is None
    assert informational.summary() == "no shadow: the previous release's slot is gone"


def test_shadow_is_skipped_while_the_governor_reports_pressure() -> None:
    hot = {"value": "71 °C ≥ step_down_c 70"}
    runner = ShadowRunner("digits", Reference(), Agreement(MANIFEST), rate=1.0, pressure=lambda: hot["value"])
    for _ in range(5):
        runner.tap("digits", feed(1), logits(1), "v")
    assert (runner.skipped_pressure, runner.sampled) == (5, 0)
    hot["value"] = None
    runner.tap("digits", feed(1), logits(1), "v")
    assert runner.sampled == 1


def test_governor_pressure_reads_heat_throttling_battery_and_a_step_down() -> None:
    thermal = Thermal(sensor_hint="cpu", step_up_c=60, step_down_c=70, throttle_c=80, critical_c=90)

    def governor(reading: SensorReading, state: str = "NOMINAL") -> SimpleNamespace:
        return SimpleNamespace(last_reading=reading, machine=SimpleNamespace(thermal=thermal, state=state))

    assert governor_pressure(governor(SensorReading(temperatures_c={"cpu": 50.0}))) is None
    assert "step_down_c 70" in (governor_pressure(governor(SensorReading(temperatures_c={"cpu": 72.0}))) or "")
    assert governor_pressure(governor(SensorReading(power_source="battery"))) == "on battery"
    throttled = SensorReading(throttled={"throttled": True})
    assert governor_pressure(governor(throttled)) == "the firmware is throttling"
    assert governor_pressure(governor(SensorReading(), "STEPPED_DOWN")) == "governor STEPPED_DOWN"


def test_shadow_rate_one_on_a_busy_device_keeps_one_worker_a_bounded_queue_and_cheap_taps() -> None:
    """docs/security.md: a deployment asking shadow_rate 1.0 cannot make answers wait or memory grow."""
    gate = threading.Event()
    reference = Reference(release=gate)  # the reference is stuck: the worst a slow model can do
    runner = ShadowRunner("digits", reference, Agreement(MANIFEST), rate=1.0).start()
    slowest = [0.0]

    def client() -> None:
        for _ in range(500):
            start = time.perf_counter()
            runner.tap("digits", feed(2), logits(2), "v")
            slowest[0] = max(slowest[0], time.perf_counter() - start)

    before = threading.active_count()
    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert threading.active_count() == before  # no thread per sample: the one worker only
    assert runner.sampled <= QUEUE_SIZE + 1  # the queue, plus the one the worker holds
    assert runner.dropped == 2000 - runner.sampled
    assert slowest[0] < 0.05  # a tap never waits for the worker (seconds, generous for CI)
    gate.set()
    runner.stop()
    assert reference.calls <= QUEUE_SIZE + 1


def start_from_slot(tmp_path, free_mb: float | None, minimum: float | None = 0.9):
    from edgesdk.agent.shadow.reference import ShadowDevice
    from edgesdk.agent.shadow.start import start_shadow

    bundle = tmp_path / "b.edgepkg"
    bundle.write_bytes(b"x")
    slots = SimpleNamespace(previous_slot="a", bundle_path=lambda slot: bundle)
    big = SimpleNamespace(precision="fp32", load_rss_mb=500.0, size=0, accuracy=None, ladder_role=None)
    loaded: list[object] = []

    def verify_and_load(fits, server):
        why_not = fits(SimpleNamespace(variants=[big]))
        if why_not is None:
            loaded.append(server)
        return why_not

    server = SimpleNamespace(taps=[], model=SimpleNamespace(name="digits", bundle_sha256="new"), profile=None)
    device = ShadowDevice(free_mb=lambda: free_mb, pressure=lambda: None, taps=None) if free_mb is not None else None
    health = SimpleNamespace(min_agreement=minimum, shadow_rate=None)
    check = start_shadow(
        health, server, MANIFEST, previous=None, slots=slots, verify_and_load=verify_and_load, device=device
    )
    return check, loaded, server


def test_shadow_of_a_previous_release_beyond_the_memory_budget_is_never_loaded(tmp_path) -> None:
    check, loaded, server = start_from_slot(tmp_path, free_mb=120.0)
    assert loaded == [] and server.taps == []
    assert check.absent == "the previous release needs 500.0 MB to load and the model memory budget has 120.0 MB free"
    assert "shadow agreement cannot be checked (the previous release needs 500.0 MB" in (
        check.breach(final=False) or ""
    )
    informational, _, _ = start_from_slot(tmp_path, free_mb=120.0, minimum=None)
    assert informational.breach(final=True) is None  # not asked for: the update goes on without a shadow
    unknown, loaded, _ = start_from_slot(tmp_path, free_mb=None)
    assert loaded == [] and "knows no memory budget" in (unknown.absent or "")
