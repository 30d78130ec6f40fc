"""Operator side without a broker: signed deployments, rollout plans, the deployment database."""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgesdk.errors import SignatureError, UsageError
from edgesdk.fleet.deployments import ABORTED, SUCCEEDED
from edgesdk.fleet.rollout import (
    RolloutController,
    RolloutPlan,
    parse_duration,
    parse_percent,
    parse_waves,
    plan_waves,
)
from edgesdk.fleet.service.operator_db import open_rollout_store
from edgesdk.keys import generate_publisher_key, load_publisher_private_key, load_publisher_public_key
from edgesdk.protocol.signing import canonical_json, sign_deployment, verify_deployment
from edgesdk.schemas.messages import Deployment, OtaStatus


def deployment(deployment_id: str = "dep-1") -> Deployment:
    return Deployment(
        deployment_id=deployment_id,
        issued_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
        expires_at=datetime(2026, 1, 1, 6, tzinfo=timezone.utc),
        sequence=1,
        targets=["dev-1"],
        model_name="digits",
        model_version="1.1.0",
        release=2,
        bundle_sha256=hashlib.sha256(b"x").hexdigest(),
        bundle_size=1,
    )


@pytest.fixture(scope="module")
def operator(tmp_path_factory):
    priv, pub = generate_publisher_key(tmp_path_factory.mktemp("operator"))
    return load_publisher_private_key(priv), load_publisher_public_key(pub)


def test_signed_deployment_verifies_and_any_change_breaks_it(operator) -> None:
    private, public = operator
    signed = sign_deployment(deployment(), private)
    assert verify_deployment(signed, [public])
    assert b"signature" not in canonical_json(signed)
    changes = (
        {"release": 3},
        {"bundle_sha256": "0" * 64},
        {"action": "rollback"},
        {"targets": ["dev-9"]},
        {"target_groups": ["all"]},
        {"wave": 2},
        {"sequence": 99},
        {"expires_at": datetime(2030, 1, 1, tzinfo=timezone.utc)},
    )
    for change in changes:
        with pytest.raises(SignatureError, match="does not verify"):
            verify_deployment(signed.model_copy(update=change), [public])


def test_unsigned_malformed_and_unknown_signers_are_refused(operator, tmp_path: Path) -> None:
    private, public = operator
    with pytest.raises(SignatureError, match="not signed"):
        verify_deployment(deployment(), [public])
    with pytest.raises(SignatureError, match="malformed"):
        verify_deployment(deployment().model_copy(update={"signature": "rsa:abc"}), [public])
    other_priv, _ = generate_publisher_key(tmp_path / "other")
    foreign = sign_deployment(deployment(), load_publisher_private_key(other_priv))
    with pytest.raises(SignatureError, match="unknown key"):
        verify_deployment(foreign, [public])


@pytest.mark.parametrize(("text", "value"), [("10%", 0.1), ("5", 0.05), (" 100% ", 1.0), ("0%", 0.0), ("12.5%", 0.125)])
def test_parse_percent(text: str, value: float) -> None:
    assert parse_percent(text, option="--canary") == pytest.approx(value)


@pytest.mark.parametrize("text", ["ten", "-5%", "150%", ""])
def test_parse_percent_rejects_with_the_value(text: str) -> None:
    with pytest.raises(UsageError, match="--canary"):
        parse_percent(text, option="--canary")


def test_parse_waves_and_durations() -> None:
    assert parse_waves("10%,50%,100%") == (0.1, 0.5, 1.0)
    for bad in ("50%,10%,100%", "10%,50%", ""):
        with pytest.raises(UsageError, match="--waves"):
            parse_waves(bad)
    assert parse_duration("10m", option="--probation") == 600
    assert parse_duration("250ms", option="--probation") == 0.25
    assert parse_duration("90", option="--probation") == 90
    with pytest.raises(UsageError, match="'soon'"):
        parse_duration("soon", option="--probation")


def test_plan_waves_canary_first_every_device_once_and_stable() -> None:
    devices = [f"dev-{i:03d}" for i in range(100)]
    plan = RolloutPlan(canary=0.1, waves=(0.1, 0.5, 1.0))
    waves = plan_waves(devices, plan, seed="dep-1")
    assert [len(w) for w in waves] == [10, 40, 50]  # the 10% wave is the canary itself
    assert sorted(d for w in waves for d in w) == devices
    assert plan_waves(list(reversed(devices)), plan, seed="dep-1") == waves  # resumable
    assert plan_waves(devices, plan, seed="dep-2")[0] != waves[0]  # each rollout its own canary
    assert plan_waves(["only"], plan, seed="x") == [["only"]]
    assert [len(w) for w in plan_waves(devices[:3], RolloutPlan(canary=0.0, waves=(1.0,)), seed="x")] == [3]


def test_deployment_store_records_statuses_in_order(tmp_path: Path) -> None:
    store = open_rollout_store(tmp_path / "fleet.sqlite3")
    message = deployment()
    store.create(message, tmp_path / "bundle.edgepkg", RolloutPlan().to_json(), [["a"], ["b", "c"]])
    with pytest.raises(UsageError, match="already exists"):
        store.create(message, tmp_path / "bundle.edgepkg", RolloutPlan().to_json(), [["a"]])
    assert store.wave_count("dep-1") == 2

    def status(device: str, state: str, second: int, progress: float | None = None) -> OtaStatus:
        return OtaStatus(
            device_id=device,
            deployment_id="dep-1",
            msg_id=f"{device}-{second}",
            ts=datetime(2026, 1, 1, 0, 0, second, tzinfo=timezone.utc),
            state=state,  # type: ignore[arg-type]
            progress=progress,
        )

    assert store.record_status(status("a", "PROBATION", 5))
    assert not store.record_status(status("a", "DOWNLOADING", 2))  # late redelivery: older
    assert not store.record_status(status("a", "DOWNLOADING", 6, progress=0.5))  # late progress tick
    assert store.record_status(status("a", "COMMITTED", 7))
    assert not store.record_status(status("zz", "COMMITTED", 7))  # not a target
    assert store.summary("dep-1")["by_state"] == {"COMMITTED": 1, "PENDING": 2}
    with pytest.raises(UsageError, match="'nope' not found"):
        store.get("nope")
    # A second connection (another shell running `fleet status`) sees the same data.
    assert open_rollout_store(tmp_path / "fleet.sqlite3").devices("dep-1", 0)[0].state == "COMMITTED"


class SimulatedFleet:
    """The MQTT client a RolloutController talks to, with simulated devices behind it.

    A device checks the operator's signature on every message, that it is addressed to the
    device whose topic it came on, and that its sequence is above the last one the device
    accepted (as edgesdk.agent.ota.freshness does), answers an install with
    COMMITTED (or FAILED when it is in ``failing``), and a rollback of a committed update with
    ROLLED_BACK, as the agent does (``agent/ota/manager.py``: ``rollback_committed``)."""

    def __init__(self, public_key, failing: set[str], silent: frozenset[str] = frozenset()) -> None:
        self.public_key = public_key
        self.failing = failing
        self.silent = silent  # devices that never answer (switched off, or an id no device has)
        self.on_message = None
        self.state: dict[str, str] = {}
        self.rollbacks_received: list[str] = []
        self.commands: list[Deployment] = []
        self.last_sequence: dict[str, int] = {}
        self._second = 0

    def subscribe(self, _topic_filter: str, qos: int = 0) -> None:
        pass

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> int:
        _, scope, device, *suffix = topic.split("/")
        assert scope == "devices" and suffix == ["ota", "deployment"], topic
        message = Deployment.model_validate_json(payload)
        assert verify_deployment(message, [self.public_key])
        assert device in message.targets, (device, message.targets)
        assert message.sequence is not None and message.sequence > self.last_sequence.get(device, 0)
        assert message.expires_at is not None and message.expires_at > datetime.now(timezone.utc)
        self.last_sequence[device] = message.sequence
        self.commands.append(message)
        if device in self.silent:
            return 1
        if message.action == "install":
            self._report(message, device, "FAILED" if device in self.failing else "COMMITTED")
        elif message.action == "rollback":
            self.rollbacks_received.append(device)
            if self.state.get(device) == "COMMITTED":
                self._report(message, device, "ROLLED_BACK")
        return 1

    def _report(self, message: Deployment, device: str, state: str) -> None:
        self._second += 1
        self.state[device] = state
        status = OtaStatus(
            device_id=device,
            deployment_id=message.deployment_id,
            msg_id=f"{device}-{self._second}",
            ts=datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=self._second),
            state=state,  # type: ignore[arg-type]
            reason="smoke test failed" if state == "FAILED" else "",
        )
        assert self.on_message is not None
        self.on_message(f"edgesdk/devices/{device}/ota/status", status.model_dump_json().encode())


TWENTY_DEVICES = [f"dev-{i:02d}" for i in range(20)]


def run_simulated_rollout(
    tmp_path: Path, operator, plan: RolloutPlan, failing: set[str], silent: frozenset[str] = frozenset(), **kwargs
):
    """Run a real RolloutController over twenty simulated devices; returns (outcome, fleet, store, waves)."""
    private, public = operator
    tmp_path.mkdir(exist_ok=True)
    bundle = tmp_path / "bundle.edgepkg"
    bundle.write_bytes(b"x")  # deployment() describes these bytes; the controller serves chunks from them
    # What RolloutController.create stores: an unsigned template; the controller issues commands.
    message = deployment().model_copy(update={"sequence": 0, "targets": TWENTY_DEVICES})
    store = open_rollout_store(tmp_path / "fleet.sqlite3")
    waves = plan_waves(TWENTY_DEVICES, plan, seed=message.deployment_id)
    store.create(message, bundle, plan.to_json(), waves)
    fleet = SimulatedFleet(public, failing, silent)
    controller = RolloutController(store, fleet, "edgesdk", private, poll_s=0.01, **kwargs).start()
    return controller.run(message.deployment_id), fleet, store, waves


def test_max_failures_tolerates_failures_up_to_its_level(tmp_path: Path, operator) -> None:
    # 5 % of 20 devices is one: one failed device among all twenty is tolerated and the rollout
    # goes on to the end.
    plan = RolloutPlan(canary=0.0, waves=(0.5, 1.0), max_failures=0.05, probation_s=1, wave_timeout_s=60)
    waves = plan_waves(TWENTY_DEVICES, plan, seed="dep-1")
    outcome, fleet, store, _ = run_simulated_rollout(tmp_path / "late", operator, plan, failing={waves[1][3]})
    assert outcome == SUCCEEDED
    assert store.summary("dep-1")["by_state"] == {"COMMITTED": 19, "FAILED": 1}
    assert fleet.rollbacks_received == []
    # The share counts the devices sent so far: the same failure in the first half is 1 of 10.
    outcome, _, store, _ = run_simulated_rollout(tmp_path / "early", operator, plan, failing={waves[0][3]})
    assert outcome == ABORTED and "1 of 10 devices failed" in store.get("dep-1").reason


def test_a_device_that_never_answers_fails_its_wave_at_the_deadline_and_polls_log_only_changes(
    tmp_path: Path, operator
) -> None:
    # One of twenty devices never answers (an id no device has, say): at the wave's deadline it
    # is TIMED_OUT, counted as a failure by the gate, and the rollout ends instead of waiting.
    plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=0.05, probation_s=1, wave_timeout_s=0.5)
    silent = frozenset({TWENTY_DEVICES[7]})
    events: list[tuple[str, dict]] = []
    outcome, _, store, _ = run_simulated_rollout(
        tmp_path, operator, plan, failing=set(), silent=silent, on_progress=lambda e, i: events.append((e, i))
    )
    assert outcome == SUCCEEDED  # 1 of 20 is within max_failures 5 %
    row = next(d for d in store.devices("dep-1") if d.device_id in silent)
    assert (row.state, row.reason) == ("TIMED_OUT", "no answer within 0.5s (last SENT)")
    # About fifty polls while waiting, two changes (sent, then the timeout): two progress events.
    progress = [info for event, info in events if event == "wave_progress"]
    assert len(progress) <= 3, progress
    assert progress[-1]["states"] == {"COMMITTED": 19, "TIMED_OUT": 1}


def test_a_resumed_wave_keeps_the_deadline_of_its_first_send(tmp_path: Path, operator) -> None:
    # The wave was sent 1000 s ago by a controller that then stopped (a restarted service): its
    # 120 s deadline has passed, so the resumed controller times the silent device out at once
    # instead of granting it another full deadline (a service restarted often never ended it).
    import sqlalchemy as sa

    from edgesdk.fleet.service import schema

    private, public = operator
    bundle = tmp_path / "bundle.edgepkg"
    bundle.write_bytes(b"x")
    plan = RolloutPlan(canary=0.0, waves=(1.0,), max_failures=0.5, probation_s=1, wave_timeout_s=120)
    store = open_rollout_store(tmp_path / "fleet.sqlite3")
    store.create(
        deployment().model_copy(update={"sequence": 0, "targets": ["a", "b"]}), bundle, plan.to_json(), [["a", "b"]]
    )
    store.set_state("dep-1", "IN_PROGRESS", wave=0)
    store.mark_sent("dep-1", ["a", "b"])
    with store.engine.begin() as db:
        db.execute(
            schema.deployment_devices.update().values(sent=sa.func.coalesce(schema.deployment_devices.c.sent, 0) - 1000)
        )
    fleet = SimulatedFleet(public, set(), frozenset({"b"}))
    controller = RolloutController(store, fleet, "edgesdk", private, poll_s=0.01).start()
    started = time.monotonic()
    assert controller.run("dep-1") == SUCCEEDED  # 1 of 2 within max_failures 50 %
    assert time.monotonic() - started < 60  # not the wave's 120 s: b was sent long ago (3 s bound flaked under load)
    assert {d.device_id: d.state for d in store.devices("dep-1")} == {"a": "COMMITTED", "b": "TIMED_OUT"}


def test_one_failure_past_max_failures_aborts_and_rolls_back_the_whole_wave(tmp_path: Path, operator) -> None:
    # Two failures among twenty is 10 % > 5 %: abort. Like Mender and hawkBit, the failed wave
    # is rolled back as a whole, its devices that already committed included; the wave before
    # it passed and keeps the new model; the devices never reached stay untouched.
    plan = RolloutPlan(canary=0.0, waves=(0.25, 0.75, 1.0), max_failures=0.05, probation_s=1, wave_timeout_s=60)
    waves = plan_waves(TWENTY_DEVICES, plan, seed="dep-1")
    assert [len(w) for w in waves] == [5, 10, 5]
    failing = {waves[1][-2], waves[1][-1]}  # the wave's last two: eight of its devices commit first
    outcome, fleet, store, _ = run_simulated_rollout(tmp_path, operator, plan, failing=failing)
    assert outcome == ABORTED
    assert "2 of 15 devices failed" in store.get("dep-1").reason
    states = {row.device_id: row.state for row in store.devices("dep-1")}
    assert {states[d] for d in waves[0]} == {"COMMITTED"}  # the earlier wave passed and stays
    committed_then_aborted = [d for d in waves[1] if d not in failing]
    assert {states[d] for d in committed_then_aborted} == {"ROLLED_BACK"}
    assert {states[d] for d in failing} == {"FAILED"}
    assert {states[d] for d in waves[2]} == {"PENDING"}  # never sent
    assert sorted(fleet.rollbacks_received) == sorted(waves[1])


def test_each_wave_gets_its_own_command_addressed_to_exactly_its_devices(tmp_path: Path, operator) -> None:
    plan = RolloutPlan(canary=0.1, waves=(0.5, 1.0), max_failures=0.05, probation_s=1, wave_timeout_s=60)
    outcome, fleet, store, waves = run_simulated_rollout(tmp_path, operator, plan, failing=set())
    assert outcome == SUCCEEDED
    by_wave: dict[int | None, list[Deployment]] = {}
    for command in fleet.commands:
        by_wave.setdefault(command.wave, []).append(command)
    assert sorted(by_wave) == list(range(len(waves)))
    for index, wave in enumerate(waves):
        assert len({c.sequence for c in by_wave[index]}) == 1  # one command per wave, sent to each device
        assert by_wave[index][0].targets == sorted(wave)
    sequences = [by_wave[i][0].sequence for i in range(len(waves))]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    # The database stores a template no device accepts: unsigned, sequence 0.
    template = store.get("dep-1").message
    assert template.sequence == 0 and template.signature is None


def test_sequence_numbers_rise_across_deployments_and_a_new_database(tmp_path: Path) -> None:
    first = open_rollout_store(tmp_path / "a.sqlite3")
    numbers = [first.next_sequence("key-1") for _ in range(3)]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3
    assert first.next_sequence("key-2") >= numbers[0]  # each key has its own counter
    # A lost or second database still issues above what the first did (Unix-millisecond floor).
    assert open_rollout_store(tmp_path / "b.sqlite3").next_sequence("key-1") > numbers[0]
    assert open_rollout_store(tmp_path / "a.sqlite3").next_sequence("key-1") > numbers[-1]
