"""The update state machine as a scenario table (Mender style): inject an error, and a power
loss, at every persisted state; the device must end serving the old or the new model — never
none — and the last status it published must tell which."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from edgesdk.agent.ota import machine as machine_module
from edgesdk.agent.ota.machine import WORK, ProbationFailed, StateWork, UpdateCancelled, UpdateMachine
from edgesdk.agent.ota.record import StateFile, UpdateRecord
from edgesdk.agent.ota.states import (
    RESTING_STATES,
    RESUME,
    TRANSITIONS,
    UpdateEvent,
    UpdateState,
    next_state,
    resume_state,
)

from edgesdk.errors import IntegrityError, UpdateError
from edgesdk.schemas.messages import Deployment, HealthCriteria, OtaStatus, RunningModel
from tests.ota_helpers import command_fields

S = UpdateState
OLD, NEW = "old", "new"


class SimulatedPowerLoss(BaseException):
    """Raised from the save hook: the process 'dies' right after a state hit the disk."""


@dataclass
class FakeDisk:
    """What survives a power loss: the A/B slots and which one is active/committed."""

    slots: dict[str, str] = field(default_factory=lambda: {"a": OLD})
    active: str = "a"
    previous: str | None = None
    committed: bool = True
    downloaded: bool = False


class FakeDevice:
    """An UpdateTarget whose slots live on a FakeDisk and whose serving model is volatile."""

    def __init__(self, disk: FakeDisk, *, fail_in: UpdateState | None = None, fail_after_switch: bool = False):
        self.disk = disk
        self.serving: str | None = disk.slots[disk.active]  # what a freshly started agent loads
        self.fail_in = fail_in
        self.fail_after_switch = fail_after_switch
        self.published: list[OtaStatus] = []
        self.serving_history: list[str | None] = [self.serving]
        self.bundle_file = Path("/fake/bundle.edgepkg")  # what download() finds or fetches
        self.downloads = 0
        self.staged_from: list[Path] = []

    def _maybe_fail(self, state: UpdateState) -> None:
        if self.fail_in is state:
            raise IntegrityError(f"injected failure in {state.value}")

    def _serve(self, model: str | None) -> None:
        self.serving = model
        self.serving_history.append(model)

    def download(self, deployment, progress, cancelled) -> Path:
        self._maybe_fail(S.DOWNLOADING)
        if cancelled():
            raise UpdateCancelled("cancelled")
        progress(1.0)
        self.disk.downloaded = True
        self.downloads += 1
        return self.bundle_file

    def verify(self, deployment, path) -> None:
        self._maybe_fail(S.VERIFYING)

    def stage(self, deployment, path) -> str:
        self.staged_from.append(path)
        inactive = "b" if self.disk.active == "a" else "a"
        self.disk.slots[inactive] = NEW
        self._maybe_fail(S.STAGED)
        return inactive

    def shadow_phase(self, deployment, slot, cancelled) -> str:
        raise AssertionError("these deployments set no shadow_s: the machine must not start a shadow phase")

    def activate(self, deployment, slot) -> None:
        if self.fail_in is S.ACTIVATING and not self.fail_after_switch:
            raise UpdateError("injected failure before the switch")
        if self.disk.active != slot:
            self.disk.previous, self.disk.active, self.disk.committed = self.disk.active, slot, False
        if self.fail_in is S.ACTIVATING:
            raise UpdateError("injected failure after the slot switch, before serving")
        self._serve(self.disk.slots[slot])

    def probation(self, deployment, started, restarts, cancelled) -> None:
        if self.fail_in is S.PROBATION:
            raise ProbationFailed("p95 latency 80 ms > SLO 10 ms")

    def commit(self, deployment) -> None:
        self._maybe_fail(S.COMMITTED)
        self.disk.committed = True

    def rollback(self, activated_slot) -> None:
        self._maybe_fail(S.ROLLING_BACK)
        if activated_slot is not None and self.disk.active == activated_slot and self.disk.previous:
            self.disk.active, self.disk.previous = self.disk.previous, None
            self.disk.committed = True
        self._serve(self.disk.slots[self.disk.active])

    def discard(self, deployment) -> None:
        self.disk.downloaded = False

    def running_model(self) -> RunningModel | None:
        if self.serving is None:
            return None
        release = 2 if self.serving == NEW else 1
        return RunningModel(
            name="digits", version=f"1.{release}.0", release=release, variant="onnx-fp32", sha256="0" * 64
        )

    def publish(self, status: OtaStatus) -> None:
        self.published.append(status)


def make_deployment(deployment_id: str = "dep-1", **health: object) -> Deployment:
    return Deployment(
        deployment_id=deployment_id,
        **command_fields(),
        model_name="digits",
        model_version="1.2.0",
        release=2,
        bundle_sha256=hashlib.sha256(b"bundle").hexdigest(),
        bundle_size=6,
        health=HealthCriteria(**health),  # type: ignore[arg-type]
    )


def boot(tmp_path: Path, disk: FakeDisk, **kwargs) -> tuple[UpdateMachine, FakeDevice]:
    """Start an 'agent': serving comes from the disk, the machine from the state file."""
    hook: Callable[[UpdateState], None] | None = kwargs.pop("hook", None)
    device = FakeDevice(disk, **kwargs)
    machine = UpdateMachine(device, StateFile(tmp_path / "state.json"), device_id="dev-1", on_state_saved=hook)
    return machine, device


def power_loss_at(state: UpdateState, times: int = 1) -> Callable[[UpdateState], None]:
    remaining = [times]

    def hook(saved: UpdateState) -> None:
        if saved is state and remaining[0] > 0:
            remaining[0] -= 1
            raise SimulatedPowerLoss(state.value)

    return hook


def assert_truthful(device: FakeDevice, final: UpdateState, expected_model: str) -> None:
    assert device.serving == expected_model
    assert None not in device.serving_history, "the device stopped serving at some point"
    last = device.published[-1]
    assert last.state == final.value
    assert last.model is not None and last.model.release == (2 if expected_model == NEW else 1)


# -- the tables themselves -----------------------------------------------------------------------


def test_every_busy_state_can_fail_and_every_state_can_resume() -> None:
    busy = [s for s in S if s not in (S.IDLE, S.COMMITTED, S.ROLLED_BACK, S.FAILED)]
    for state in busy:
        assert next_state(state, UpdateEvent.ERROR) in (S.FAILED, S.ROLLING_BACK), state
        assert next_state(state, UpdateEvent.LOOP_DETECTED) in (S.FAILED, S.ROLLING_BACK), state
    assert set(RESUME) == set(S)
    # From activation on, anything uncertain goes back, never forward.
    assert resume_state(S.ACTIVATING) is S.ROLLING_BACK
    for (state, _event), target in TRANSITIONS.items():
        assert isinstance(state, S) and isinstance(target, S)


def test_every_busy_state_has_exactly_one_work_row_whose_outcomes_the_table_knows() -> None:
    assert set(WORK) == set(S) - RESTING_STATES
    assert len({work.step for work in WORK.values()}) == len(WORK), "two states share one step"
    for state, work in WORK.items():
        # LOOP_DETECTED is the machine's own event, possible in every busy state.
        outcomes = {work.done, *work.failures, UpdateEvent.LOOP_DETECTED}
        for event in outcomes:
            assert (state, event) in TRANSITIONS, f"{state.value} may report {event.value}; the table has no row"
        leaving = {event for (source, event) in TRANSITIONS if source is state}
        assert leaving == outcomes, f"{state.value}: transitions {leaving} but the work reports {outcomes}"


def test_the_machine_does_what_the_work_table_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def checked_twice(machine: UpdateMachine, deployment: Deployment) -> str:
        calls.append(deployment.deployment_id)
        return "checked by the replaced step"

    monkeypatch.setitem(WORK, S.VERIFYING, StateWork(checked_twice, UpdateEvent.VERIFIED, WORK[S.VERIFYING].failures))
    assert machine_module.WORK is WORK
    machine, device = boot(tmp_path, FakeDisk())
    assert machine.start(make_deployment("dep-7")) is S.COMMITTED
    assert calls == ["dep-7"]
    assert any(p.reason == "checked by the replaced step" for p in device.published if p.state == "STAGED")


def test_happy_path_persists_each_state_before_its_work(tmp_path: Path) -> None:
    seen: list[str] = []
    state_file = StateFile(tmp_path / "state.json")

    def hook(saved: UpdateState) -> None:
        seen.append(state_file.load().state.value)  # on disk already when the work starts

    machine, device = boot(tmp_path, FakeDisk(), hook=hook)
    assert machine.start(make_deployment()) is S.COMMITTED
    assert seen == ["DOWNLOADING", "VERIFYING", "STAGED", "ACTIVATING", "PROBATION", "COMMITTED"]
    assert [p.state for p in device.published if p.progress is None] == seen
    assert_truthful(device, S.COMMITTED, NEW)
    assert device.disk.committed


# -- error injected in each state's work -----------------------------------------------------------

ERROR_SCENARIOS = [
    # (state whose work fails, fail after the slot switch?, final state, model serving at the end)
    (S.DOWNLOADING, False, S.FAILED, OLD),
    (S.VERIFYING, False, S.FAILED, OLD),
    (S.STAGED, False, S.FAILED, OLD),
    (S.ACTIVATING, False, S.ROLLED_BACK, OLD),
    (S.ACTIVATING, True, S.ROLLED_BACK, OLD),
    (S.PROBATION, False, S.ROLLED_BACK, OLD),
]


@pytest.mark.parametrize(("state", "after_switch", "final", "model"), ERROR_SCENARIOS)
def test_error_in_state(tmp_path: Path, state: UpdateState, after_switch: bool, final: UpdateState, model: str) -> None:
    machine, device = boot(tmp_path, FakeDisk(), fail_in=state, fail_after_switch=after_switch)
    assert machine.start(make_deployment()) is final
    assert_truthful(device, final, model)
    assert device.disk.slots[device.disk.active] == model
    assert device.disk.committed
    failing = [p for p in device.published if p.state in ("FAILED", "ROLLING_BACK")]
    assert failing and failing[0].reason, "the reason must be reported"


def test_error_while_rolling_back_is_reported_with_what_really_serves(tmp_path: Path) -> None:
    machine, device = boot(tmp_path, FakeDisk(), fail_in=S.PROBATION)
    device_fail_rollback = device
    original = device_fail_rollback.rollback

    def broken_rollback(slot):  # the rollback itself fails: the new model keeps serving
        raise UpdateError("slot a unreadable")

    device.rollback = broken_rollback  # type: ignore[method-assign]
    assert machine.start(make_deployment()) is S.FAILED
    assert device.serving == NEW
    last = device.published[-1]
    assert last.state == "FAILED" and "rolling_back failed" in last.reason
    assert last.model is not None and last.model.release == 2  # the truth, not the wish
    device.rollback = original  # type: ignore[method-assign]


# -- power loss right after each state hit the disk ----------------------------------------------

POWER_LOSS_SCENARIOS = [
    (S.DOWNLOADING, S.COMMITTED, NEW),
    (S.VERIFYING, S.COMMITTED, NEW),
    (S.STAGED, S.COMMITTED, NEW),
    (S.ACTIVATING, S.ROLLED_BACK, OLD),
    (S.PROBATION, S.COMMITTED, NEW),
    (S.COMMITTED, S.COMMITTED, NEW),
]


@pytest.mark.parametrize(("state", "final", "model"), POWER_LOSS_SCENARIOS)
def test_power_loss_in_state(tmp_path: Path, state: UpdateState, final: UpdateState, model: str) -> None:
    disk = FakeDisk()
    machine, device = boot(tmp_path, disk, hook=power_loss_at(state))
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment())
    assert StateFile(tmp_path / "state.json").load().state is state

    machine, device = boot(tmp_path, disk)  # reboot: serving reloads from the active slot
    assert device.serving in (OLD, NEW)
    assert machine.resume() is final
    assert_truthful(device, final, model)
    assert disk.committed


@pytest.mark.parametrize("fail_in", [S.PROBATION, S.ACTIVATING])
def test_power_loss_while_rolling_back(tmp_path: Path, fail_in: UpdateState) -> None:
    disk = FakeDisk()
    machine, _ = boot(tmp_path, disk, fail_in=fail_in, fail_after_switch=True, hook=power_loss_at(S.ROLLING_BACK))
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment())
    machine, device = boot(tmp_path, disk)
    assert machine.resume() is S.ROLLED_BACK
    assert_truthful(device, S.ROLLED_BACK, OLD)
    # Resuming a finished rollback again changes nothing (idempotent).
    machine, device = boot(tmp_path, disk)
    assert machine.resume() is S.ROLLED_BACK
    assert_truthful(device, S.ROLLED_BACK, OLD)


@pytest.mark.parametrize("state", [S.DOWNLOADING, S.VERIFYING, S.STAGED, S.ACTIVATING, S.PROBATION, S.ROLLING_BACK])
def test_power_loss_twice_in_a_row(tmp_path: Path, state: UpdateState) -> None:
    disk = FakeDisk()
    fail_in = S.PROBATION if state is S.ROLLING_BACK else None
    machine, _ = boot(tmp_path, disk, fail_in=fail_in, hook=power_loss_at(state))
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment())
    machine, _ = boot(tmp_path, disk, hook=power_loss_at(resume_state(state)))
    with pytest.raises(SimulatedPowerLoss):
        machine.resume()
    machine, device = boot(tmp_path, disk)
    final = machine.resume()
    assert final in (S.COMMITTED, S.ROLLED_BACK)
    assert_truthful(device, final, NEW if final is S.COMMITTED else OLD)


def test_crash_loop_in_probation_rolls_back(tmp_path: Path) -> None:
    disk = FakeDisk()
    machine, _ = boot(tmp_path, disk, hook=power_loss_at(S.PROBATION))
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment(max_restarts=1))
    for _ in range(1):  # first restart: allowed, dies again
        machine, _ = boot(tmp_path, disk, hook=power_loss_at(S.PROBATION))
        with pytest.raises(SimulatedPowerLoss):
            machine.resume()
    machine, device = boot(tmp_path, disk)
    assert machine.resume() is S.ROLLED_BACK
    assert "crash loop" in device.published[0].reason or "crash loop" in machine.record.reason
    assert_truthful(device, S.ROLLED_BACK, OLD)


def test_loop_detection_fails_safe(tmp_path: Path) -> None:
    disk = FakeDisk()
    for attempt in range(60):
        machine, _ = boot(tmp_path, disk, hook=power_loss_at(S.DOWNLOADING))
        try:
            if attempt == 0:
                machine.start(make_deployment())
            else:
                machine.resume()
        except SimulatedPowerLoss:
            continue
        break
    else:
        pytest.fail("the updater cycled forever")
    machine, device = boot(tmp_path, disk)
    assert machine.resume() is S.FAILED
    assert "loop detected" in machine.record.reason
    assert_truthful(device, S.FAILED, OLD)


# -- operator actions and races --------------------------------------------------------------------


def test_second_deployment_is_refused_while_busy_and_the_first_finishes(tmp_path: Path) -> None:
    disk = FakeDisk()
    started: list[str] = []
    holder: dict[str, UpdateMachine] = {}

    def hook(saved: UpdateState) -> None:
        if saved is S.VERIFYING and not started:
            started.append("x")
            with pytest.raises(UpdateError, match="dep-1"):
                holder["m"].start(make_deployment("dep-2"))

    machine, device = boot(tmp_path, disk, hook=hook)
    holder["m"] = machine
    assert machine.start(make_deployment("dep-1")) is S.COMMITTED
    assert started
    assert {p.deployment_id for p in device.published} == {"dep-1"}
    # Once resting, the next deployment is accepted.
    assert machine.start(make_deployment("dep-2")) is S.COMMITTED


def test_cancel_before_activation_keeps_the_old_model(tmp_path: Path) -> None:
    holder: dict[str, UpdateMachine] = {}

    def hook(saved: UpdateState) -> None:
        if saved is S.VERIFYING:
            holder["m"].cancel("operator abort")

    machine, device = boot(tmp_path, FakeDisk(), hook=hook)
    holder["m"] = machine
    assert machine.start(make_deployment()) is S.FAILED
    assert machine.record.reason == "operator abort"
    assert_truthful(device, S.FAILED, OLD)


def test_cancel_in_probation_rolls_back(tmp_path: Path) -> None:
    holder: dict[str, UpdateMachine] = {}

    def hook(saved: UpdateState) -> None:
        if saved is S.PROBATION:
            holder["m"].cancel("operator abort")

    machine, device = boot(tmp_path, FakeDisk(), hook=hook)
    holder["m"] = machine
    assert machine.start(make_deployment()) is S.ROLLED_BACK
    assert_truthful(device, S.ROLLED_BACK, OLD)


def test_operator_rollback_of_a_committed_deployment(tmp_path: Path) -> None:
    machine, device = boot(tmp_path, FakeDisk())
    assert machine.start(make_deployment()) is S.COMMITTED
    assert machine.rollback_committed() is S.ROLLED_BACK
    assert_truthful(device, S.ROLLED_BACK, OLD)
    with pytest.raises(UpdateError, match="nothing to roll back"):
        machine.rollback_committed()


def test_unreadable_state_file_means_roll_back(tmp_path: Path) -> None:
    disk = FakeDisk()
    machine, _ = boot(tmp_path, disk, hook=power_loss_at(S.PROBATION))
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment())
    (tmp_path / "state.json").write_bytes(b"{torn")
    machine, device = boot(tmp_path, disk)
    assert machine.state is S.ROLLING_BACK
    final = machine.resume()
    assert final is S.FAILED  # no deployment to tell which slot: make the committed slot serve
    assert device.serving == NEW or device.serving == OLD
    assert device.published[-1].model is not None


@pytest.mark.parametrize("state", [S.VERIFYING, S.STAGED])
def test_download_path_is_saved_before_the_next_work_and_used_after_a_power_loss(
    tmp_path: Path, state: UpdateState
) -> None:
    bundle = tmp_path / "ota" / "dep-1.edgepkg"
    bundle.parent.mkdir()
    bundle.write_bytes(b"bundle")
    disk = FakeDisk()
    machine, device = boot(tmp_path, disk, hook=power_loss_at(state))
    device.bundle_file = bundle
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment())
    saved = StateFile(tmp_path / "state.json").load()
    assert saved.state is state and saved.download_path == bundle

    machine, device = boot(tmp_path, disk)
    device.bundle_file = tmp_path / "rediscovered.edgepkg"  # what a fresh download would return
    assert machine.resume() is S.COMMITTED
    assert device.downloads == 0, "the saved path was not used: the download ran again"
    assert device.staged_from == [bundle]
    assert_truthful(device, S.COMMITTED, NEW)


def test_a_saved_download_path_that_is_gone_is_downloaded_again(tmp_path: Path) -> None:
    bundle = tmp_path / "dep-1.edgepkg"
    bundle.write_bytes(b"bundle")
    disk = FakeDisk()
    machine, device = boot(tmp_path, disk, hook=power_loss_at(S.VERIFYING))
    device.bundle_file = bundle
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment())
    bundle.unlink()
    machine, device = boot(tmp_path, disk)
    device.bundle_file = again = tmp_path / "again.edgepkg"
    again.write_bytes(b"bundle")
    assert machine.resume() is S.COMMITTED
    assert device.downloads == 1 and device.staged_from == [again]
    assert StateFile(tmp_path / "state.json").load().download_path == again


def test_state_file_from_before_the_download_path_still_loads_and_resumes(tmp_path: Path) -> None:
    state_file = StateFile(tmp_path / "state.json")
    state_file.save(UpdateRecord(state=S.VERIFYING, deployment=make_deployment(), save_count=2))
    old = json.loads(state_file.path.read_text())
    del old["download_path"]  # what an agent before this field wrote
    state_file.path.write_text(json.dumps(old))
    record = state_file.load()
    assert record.state is S.VERIFYING and record.download_path is None and record.save_count == 2

    machine, device = boot(tmp_path, FakeDisk())
    device.bundle_file = tmp_path / "dep-1.edgepkg"
    device.bundle_file.write_bytes(b"bundle")
    assert machine.resume() is S.COMMITTED
    assert device.downloads == 1  # no saved path: DOWNLOADING's work finds the file again, once
    assert_truthful(device, S.COMMITTED, NEW)


def test_state_file_survives_as_old_or_new(tmp_path: Path) -> None:
    state_file = StateFile(tmp_path / "ota" / "state.json")
    state_file.save(UpdateRecord(state=S.STAGED, deployment=make_deployment()))
    assert state_file.load().state is S.STAGED
    assert not list((tmp_path / "ota").glob(".*.tmp"))


# -- the boot guard: a new model that crashes the agent while loading -------------------------------


class FakeStore:
    """The part of SlotStore that guard_boot uses, over a FakeDisk."""

    def __init__(self, disk: FakeDisk) -> None:
        self.disk = disk

    def reload(self) -> None:
        pass

    @property
    def active_slot(self) -> str:
        return self.disk.active

    def rollback(self) -> str | None:
        if self.disk.previous is None:
            return None
        self.disk.active, self.disk.previous, self.disk.committed = self.disk.previous, None, True
        return self.disk.active


def test_boot_guard_breaks_a_crash_loop_before_the_model_loads(tmp_path: Path) -> None:
    from edgesdk.agent.ota.boot import guard_boot

    ota_dir = tmp_path / "ota"  # guard_boot reads <data_dir>/ota/state.json

    disk = FakeDisk()
    machine, _ = boot(ota_dir, disk, hook=power_loss_at(S.PROBATION))
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment(max_restarts=1))
    # The new model now kills the agent while it loads, before the update manager resumes.
    assert guard_boot(tmp_path, FakeStore(disk)) is None  # first restart: allowed
    assert disk.slots[disk.active] == NEW
    reason = guard_boot(tmp_path, FakeStore(disk))  # second: over max_restarts
    assert reason is not None and "crash loop: 2 restarts" in reason
    assert disk.slots[disk.active] == OLD  # switched back before anything loaded the new slot
    machine, device = boot(ota_dir, disk)
    assert machine.resume() is S.ROLLED_BACK
    assert_truthful(device, S.ROLLED_BACK, OLD)
    assert "crash loop" in device.published[-1].reason


def test_boot_guard_counts_once_with_resume(tmp_path: Path) -> None:
    from edgesdk.agent.ota.boot import guard_boot

    ota_dir = tmp_path / "ota"  # guard_boot reads <data_dir>/ota/state.json

    disk = FakeDisk()
    machine, _ = boot(ota_dir, disk, hook=power_loss_at(S.PROBATION))
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment(max_restarts=2))
    assert guard_boot(tmp_path, FakeStore(disk)) is None
    machine, device = boot(ota_dir, disk)
    assert machine.resume() is S.COMMITTED
    assert machine.record.restarts == 1  # counted by the guard, not again by resume
    assert_truthful(device, S.COMMITTED, NEW)


def test_boot_guard_rolls_the_store_back_for_activating(tmp_path: Path) -> None:
    from edgesdk.agent.ota.boot import guard_boot

    ota_dir = tmp_path / "ota"  # guard_boot reads <data_dir>/ota/state.json

    disk = FakeDisk()
    machine, _ = boot(ota_dir, disk, fail_in=None, hook=power_loss_at(S.ACTIVATING))
    with pytest.raises(SimulatedPowerLoss):
        machine.start(make_deployment())
    # Power lost after the slot switch but before the state moved on: simulate the switch.
    disk.previous, disk.active, disk.committed = disk.active, "b", False
    assert guard_boot(tmp_path, FakeStore(disk)) == "agent restarted during ACTIVATING"
    assert disk.slots[disk.active] == OLD
    machine, device = boot(ota_dir, disk)
    assert machine.resume() is S.ROLLED_BACK
    assert_truthful(device, S.ROLLED_BACK, OLD)
    assert guard_boot(tmp_path, FakeStore(disk)) is None  # nothing pending any more


# -- a state file that cannot be written (disk full) ---------------------------------------------


class FullDiskStateFile(StateFile):
    """Saves fail with ENOSPC while ``full`` holds the state being saved (None: every save)."""

    def __init__(self, path: Path, full: UpdateState | None) -> None:
        super().__init__(path)
        self.full = full
        self.full_disk = True

    def save(self, record: UpdateRecord) -> None:
        import errno

        if self.full_disk and (self.full is None or record.state is self.full):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        super().save(record)


@pytest.mark.parametrize("full", [*WORK, None], ids=lambda s: getattr(s, "value", "every-state"))
def test_a_state_that_cannot_be_saved_ends_at_rest_and_the_next_deployment_runs(
    tmp_path: Path, full: UpdateState | None
) -> None:
    """ENOSPC (any OSError) from the state file at any state: the machine never stays busy, the
    old model serves, the reason says why, and once space is back the next deployment commits."""
    disk = FakeDisk()
    device = FakeDevice(disk)
    state_file = FullDiskStateFile(tmp_path / "state.json", full)
    machine = UpdateMachine(device, state_file, device_id="dev-1")
    final = machine.start(make_deployment("dep-1", probation_s=0))
    assert not machine.busy, final
    if full is not S.ROLLING_BACK:  # that state is never entered: nothing failed after activation
        assert final in (S.FAILED, S.ROLLED_BACK), final
        assert "No space left" in machine.record.reason, machine.record.reason
        assert_truthful(device, final, OLD)
    state_file.full_disk = False
    assert machine.start(make_deployment("dep-2", probation_s=0)) is S.COMMITTED
    assert device.serving == NEW
