"""Operator side without a broker: signed deployments, rollout plans, the deployment database."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path

import pytest

from edgesdk.errors import SignatureError, UsageError
from edgesdk.fleet.deployments import DeploymentStore
from edgesdk.fleet.rollout import RolloutPlan, parse_duration, parse_percent, parse_waves, plan_waves
from edgesdk.keys import generate_publisher_key, load_publisher_private_key, load_publisher_public_key
from edgesdk.protocol.signing import canonical_json, sign_deployment, verify_deployment
from edgesdk.schemas.messages import Deployment, OtaStatus


def deployment(deployment_id: str = "dep-1") -> Deployment:
    return Deployment(
        deployment_id=deployment_id,
        issued_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
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
    for change in ({"release": 3}, {"bundle_sha256": "0" * 64}, {"action": "rollback"}, {"targets": ["dev-9"]}):
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
    store = DeploymentStore(tmp_path / "fleet.sqlite3")
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
    assert DeploymentStore(tmp_path / "fleet.sqlite3").devices("dep-1", 0)[0].state == "COMMITTED"
