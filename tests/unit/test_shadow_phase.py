"""The shadow phase before activation (issue 41, agent/shadow/phase.py): the staged model runs on
the sampled live requests the serving model answers, answers nobody, and a figure below
min_agreement refuses the update before activation; shadow_s on the wire, CLI and REST."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from edgesdk.agent.ota.machine import ProbationFailed
from edgesdk.agent.ota.states import UpdateState as S
from edgesdk.agent.shadow.phase import run_shadow_phase
from edgesdk.agent.shadow.reference import ShadowDevice

from edgesdk.schemas.messages import HealthCriteria
from tests.unit.test_health_min_agreement import deployment, rollout
from tests.unit.test_ota_state_machine import NEW, OLD, FakeDevice, FakeDisk, make_deployment
from tests.unit.test_shadow_agreement import MANIFEST, feed, logits

FITS = SimpleNamespace(
    variants=[SimpleNamespace(precision="fp32", load_rss_mb=50.0, size=0, accuracy=None, ladder_role=None)]
)
HUGE = SimpleNamespace(
    variants=[SimpleNamespace(precision="fp32", load_rss_mb=500.0, size=0, accuracy=None, ladder_role=None)]
)


class Staged:
    """The staged model: answers the label in feeds, shifted by ``shift`` (1: every answer wrong)."""

    def __init__(self, shift: int) -> None:
        self.shift = shift
        self.calls = 0

    def infer(self, model_name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        return logits((int(feeds["label"][0]) + self.shift) % 10)


def phase(staged: Staged, *, minimum: float | None, shadow_s: float, manifest=FITS, free_mb: float = 120.0):
    """Run a phase while a client thread sends 60 live requests that the serving model answers."""
    serving = SimpleNamespace(taps=[], model=SimpleNamespace(name="digits", release=1), profile=None)
    loaded: list[object] = []
    done = threading.Event()

    def load_staged(fits, server):
        why_not = fits(manifest)
        if why_not is None:
            server.infer = staged.infer  # stands in for opener.serve of the verified staged bundle
            loaded.append(server)
        return why_not

    def client() -> None:
        deadline = time.monotonic() + 10
        while not serving.taps and not done.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in range(60):
            for tap in list(serving.taps):
                tap("digits", feed(i % 10), logits(i % 10), "onnx-fp32")  # the serving model's answer
            while staged.calls < i + 1 and serving.taps and time.monotonic() < deadline:
                time.sleep(0.002)

    sender = threading.Thread(target=client, daemon=True)
    sender.start()
    device = ShadowDevice(free_mb=lambda: free_mb, pressure=lambda: None, taps=None)
    health = HealthCriteria(min_agreement=minimum, shadow_rate=1.0, shadow_s=shadow_s)
    started = time.monotonic()
    outcome = run_shadow_phase(
        health, serving, lambda: MANIFEST, load_staged=load_staged, device=device, cancelled=lambda: False
    )
    done.set()
    sender.join(10)
    return outcome, time.monotonic() - started, loaded, serving


def test_shadow_phase_refuses_a_staged_model_that_disagrees_with_the_serving_one_before_its_end() -> None:
    outcome, took, loaded, serving = phase(Staged(shift=1), minimum=0.9, shadow_s=60.0)
    assert outcome.refused is not None and outcome.refused.startswith("shadow phase: shadow agreement 0.00 (lower")
    assert "< 0.9 (logits: top1 against release 1)" in outcome.refused
    assert took < 30, "a certainly wrong model is refused without waiting out the phase"
    assert len(loaded) == 1 and serving.taps == []  # the tap leaves with the phase


def test_shadow_phase_of_a_faithful_staged_model_passes_with_its_figure() -> None:
    outcome, _, _, serving = phase(Staged(shift=0), minimum=0.9, shadow_s=3.0)
    assert outcome.refused is None, outcome.refused
    assert outcome.summary.startswith("shadow phase: shadow agreement 1.00 (lower bound 0.9")
    assert serving.taps == []


def test_shadow_phase_beyond_the_memory_budget_loads_nothing_and_fails_closed_only_when_asked() -> None:
    asked, _, loaded, _ = phase(Staged(shift=0), minimum=0.9, shadow_s=1.0, manifest=HUGE)
    assert loaded == []
    assert asked.refused == (
        "shadow phase: shadow agreement cannot be checked (the staged release needs 500.0 MB to load and the "
        "model memory budget has 120.0 MB free); the deployment asks min_agreement 0.9"
    )
    informational, _, loaded, _ = phase(Staged(shift=0), minimum=None, shadow_s=1.0, manifest=HUGE)
    assert loaded == [] and informational.refused is None
    assert informational.summary.startswith("no shadow phase: the staged release needs 500.0 MB")


class ShadowingDevice(FakeDevice):
    """The state machine's fake device with a shadow phase that refuses (or passes) the staged model."""

    def __init__(self, disk: FakeDisk, refuse: str | None) -> None:
        super().__init__(disk)
        self.refuse = refuse
        self.shadowed: list[tuple[str, str | None]] = []

    def shadow_phase(self, deployment, slot, cancelled) -> str:
        self.shadowed.append((slot, self.serving))
        if self.refuse is not None:
            raise ProbationFailed(self.refuse)
        return "shadow phase: shadow agreement 1.00"


def run_update(tmp_path: Path, refuse: str | None, **health: object) -> ShadowingDevice:
    from edgesdk.agent.ota.machine import UpdateMachine
    from edgesdk.agent.ota.record import StateFile

    device = ShadowingDevice(FakeDisk(), refuse)
    machine = UpdateMachine(device, StateFile(tmp_path / "state.json"), device_id="dev-1")
    machine.start(make_deployment(**health))
    return device


def test_update_refused_in_its_shadow_phase_fails_before_activation_with_the_figure(tmp_path: Path) -> None:
    why = "shadow phase: shadow agreement 0.00 (lower bound 0.00 over 40 requests) < 0.95 (logits: top1)"
    device = run_update(tmp_path, why, shadow_s=600.0, min_agreement=0.95)
    assert device.shadowed == [("b", OLD)]  # after staging, while the old model served
    assert device.serving_history == [OLD] and device.disk.active == "a"  # never activated
    assert device.published[-1].state == S.FAILED.value and device.published[-1].reason == why
    assert any("shadow phase for 600 s before activation" in (s.reason or "") for s in device.published)


def test_update_with_a_passing_shadow_phase_activates_and_one_without_shadow_s_has_none(tmp_path: Path) -> None:
    device = run_update(tmp_path / "a", None, shadow_s=60.0)
    assert device.shadowed == [("b", OLD)] and device.serving == NEW
    assert device.published[-1].state == S.COMMITTED.value
    plain = run_update(tmp_path / "b", None)
    assert plain.shadowed == [] and plain.serving == NEW


def test_shadow_s_is_off_the_wire_unless_asked_bounded_and_reaches_health_and_rest() -> None:
    from edgesdk.fleet.service.rest.deployments import _wave_timeout_s
    from edgesdk.fleet.service.rest.schemas import DeploymentCreate
    from edgesdk.protocol.signing import canonical_json, command_payload

    assert b"shadow_s" not in command_payload(deployment(HealthCriteria())) + canonical_json(
        deployment(HealthCriteria())
    )
    assert b'"shadow_s":600.0' in command_payload(deployment(HealthCriteria(shadow_s=600)))
    with pytest.raises(ValueError, match="less than or equal to 2592000"):
        HealthCriteria(shadow_s=1e12)  # bounded like probation_s: 30 days
    with pytest.raises(ValueError, match="shadow_s needs a shadow_rate above 0"):
        HealthCriteria(shadow_s=60, shadow_rate=0)
    args = rollout(shadow_for="10m")
    plan = args.plan()
    assert args.health(plan).shadow_s == 600.0 and args.api_body()["shadow_s"] == 600.0
    assert plan.wave_timeout_s == 60 + 600 + 600  # probation 1m + the phase + 10 min
    assert "shadow_s" not in rollout().api_body() and rollout().plan().wave_timeout_s is None
    assert "shadow_s" not in rollout(shadow_for="0s").api_body()  # no phase: nothing an older agent refuses
    body = DeploymentCreate(bundle_id="b", devices=["dev-1"], probation_s=60, shadow_s=600)
    assert _wave_timeout_s(body) == 1260.0


def test_fleet_push_bad_shadow_for_is_one_clear_line() -> None:
    from edgesdk.errors import UsageError

    with pytest.raises(UsageError) as caught:
        rollout(shadow_for="forever").plan()
    assert "--shadow-for" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="--shadow-for needs a --shadow-rate above 0%"):
        args = rollout(shadow_for="10m", shadow_rate="0%")
        args.health(args.plan())


def test_a_cancel_ends_the_shadow_phase_and_the_update_fails_unactivated(tmp_path: Path) -> None:
    from edgesdk.agent.ota.machine import UpdateMachine
    from edgesdk.agent.ota.record import StateFile

    serving = SimpleNamespace(taps=[], model=SimpleNamespace(name="digits", release=1), profile=None)
    device = ShadowDevice(free_mb=lambda: 120.0, pressure=lambda: None, taps=None)
    started = time.monotonic()
    outcome = run_shadow_phase(
        HealthCriteria(min_agreement=0.9, shadow_s=600),
        serving,
        lambda: MANIFEST,
        load_staged=lambda fits, server: fits(FITS),
        device=device,
        cancelled=lambda: True,
    )
    assert outcome.refused is None and time.monotonic() - started < 60 and serving.taps == []  # not the 600 s

    class Cancelling(ShadowingDevice):
        def shadow_phase(self, deployment, slot, cancelled) -> str:
            machine.cancel()  # the operator's cancel arrives during the phase
            assert cancelled()
            return "shadow phase: cut short"

    fake = Cancelling(FakeDisk(), None)
    machine = UpdateMachine(fake, StateFile(tmp_path / "state.json"), device_id="dev-1")
    machine.start(make_deployment(shadow_s=600.0))
    assert fake.serving_history == [OLD] and fake.published[-1].state == S.FAILED.value
    assert fake.published[-1].reason == "cancelled by operator"
