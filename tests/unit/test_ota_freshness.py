"""The device's checks on a signed command: audience, freshness window, replay (agent/ota/freshness.py)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from edgesdk.agent.ota.freshness import Admission, CommandGate, CommandRefused, SequenceLedger

from edgesdk.errors import SchemaError
from edgesdk.schemas.messages import Deployment

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


def command(sequence: int = 10, *, signature: str | None = None, **fields: object) -> Deployment:
    data: dict[str, object] = {
        "deployment_id": "dep-1",
        "issued_at": NOW - timedelta(hours=2),
        "expires_at": NOW + timedelta(hours=1),
        "sequence": sequence,
        "targets": ["dev-1"],
        "model_name": "digits",
        "model_version": "1.1.0",
        "release": 2,
        "bundle_sha256": hashlib.sha256(b"x").hexdigest(),
        "bundle_size": 1,
        "signature": signature or f"ed25519:key:{sequence}",
    }
    return Deployment.model_validate({**data, **fields})


def gate(tmp_path: Path, **kwargs: object) -> CommandGate:
    options: dict = {"device_id": "dev-1", "groups": ("line-1",), "clock_skew_s": 300.0} | kwargs
    return CommandGate(SequenceLedger(tmp_path / "command_sequence.json"), **options)


def refusal(the_gate: CommandGate, message: Deployment, issuer: str = "key") -> CommandRefused:
    with pytest.raises(CommandRefused) as caught:
        the_gate.admit(message, issuer, now=NOW)
    return caught.value


def test_a_fresh_addressed_new_command_is_admitted_and_its_sequence_persisted(tmp_path: Path) -> None:
    the_gate = gate(tmp_path)
    assert the_gate.admit(command(10), "key", now=NOW) is Admission.ACT
    saved = json.loads((tmp_path / "command_sequence.json").read_text())
    assert saved["issuers"]["key"]["sequence"] == 10
    assert gate(tmp_path).ledger.last("key") == 10  # a restarted agent reads it back


def test_replays_are_refused_even_after_a_restart(tmp_path: Path) -> None:
    the_gate = gate(tmp_path)
    old, new = command(10), command(11, deployment_id="dep-2")
    assert the_gate.admit(old, "key", now=NOW) is Admission.ACT
    assert the_gate.admit(new, "key", now=NOW) is Admission.ACT
    error = refusal(the_gate, old)
    assert error.why == "replay" and "sequence 10, not above the last accepted 11" in str(error)
    assert refusal(gate(tmp_path), old).why == "replay"  # the window stays shut across a restart
    # A different command carrying the last sequence (not the exact message) is a replay too.
    assert refusal(the_gate, command(11, signature="ed25519:key:forged")).why == "replay"


def test_the_exact_last_command_again_is_a_repeat_not_an_action(tmp_path: Path) -> None:
    the_gate = gate(tmp_path)
    assert the_gate.admit(command(10), "key", now=NOW) is Admission.ACT
    assert the_gate.admit(command(10), "key", now=NOW) is Admission.REPEAT


def test_sequences_are_per_signing_key(tmp_path: Path) -> None:
    the_gate = gate(tmp_path)
    assert the_gate.admit(command(50), "key-a", now=NOW) is Admission.ACT
    assert the_gate.admit(command(5), "key-b", now=NOW) is Admission.ACT
    assert refusal(the_gate, command(49), "key-a").why == "replay"


@pytest.mark.parametrize(
    ("fields", "why", "needle"),
    [
        ({"expires_at": NOW - timedelta(minutes=6)}, "expired", "expired at 2026-06-01T11:54"),
        ({"issued_at": NOW + timedelta(minutes=6), "expires_at": NOW + timedelta(hours=1)}, "not_yet_valid", "skew"),
        ({"targets": ["dev-2"]}, "not_addressed", "is for dev-2"),
        ({"targets": [], "target_groups": ["line-2"]}, "not_addressed", "group line-2"),
    ],
)
def test_stale_future_and_misaddressed_commands_are_refused(
    tmp_path: Path, fields: dict[str, object], why: str, needle: str
) -> None:
    the_gate = gate(tmp_path)
    error = refusal(the_gate, command(10, **fields))
    assert error.why == why and needle in str(error), str(error)
    assert the_gate.ledger.last("key") == 0  # a refused command consumes no sequence
    assert not (tmp_path / "command_sequence.json").exists()


def test_clock_skew_tolerance_applies_both_ways(tmp_path: Path) -> None:
    the_gate = gate(tmp_path)
    # Expired four minutes ago, issued four minutes ahead: inside a five-minute tolerance.
    assert the_gate.admit(command(1, expires_at=NOW - timedelta(minutes=4)), "key", now=NOW) is Admission.ACT
    ahead = command(2, issued_at=NOW + timedelta(minutes=4), expires_at=NOW + timedelta(hours=1))
    assert the_gate.admit(ahead, "key", now=NOW) is Admission.ACT
    strict = gate(tmp_path / "strict", clock_skew_s=0)
    assert refusal(strict, command(3, expires_at=NOW - timedelta(seconds=1))).why == "expired"


def test_a_group_command_reaches_members(tmp_path: Path) -> None:
    assert gate(tmp_path).admit(command(1, targets=[], target_groups=["line-1"]), "key", now=NOW) is Admission.ACT


def test_version_1_commands_parse_but_are_never_acted_on(tmp_path: Path) -> None:
    legacy = Deployment.model_validate(
        {
            "schema_version": 1,
            "deployment_id": "dep-old",
            "issued_at": NOW,
            "model_name": "digits",
            "model_version": "1.0.0",
            "release": 1,
            "bundle_sha256": "a" * 64,
            "bundle_size": 1,
            "signature": "ed25519:key:x",
        }
    )
    assert refusal(gate(tmp_path), legacy).why == "unversioned"


def test_version_2_requires_the_fields(tmp_path: Path) -> None:
    base = command(1).model_dump(mode="json")
    for missing in ("expires_at", "sequence"):
        with pytest.raises(SchemaError, match=missing):
            Deployment.parse_obj_clear({k: v for k, v in base.items() if k != missing}, source="deployment")
    with pytest.raises(SchemaError, match="targets or target_groups"):
        Deployment.parse_obj_clear({**base, "targets": []}, source="deployment")
    with pytest.raises(SchemaError, match="not after issued_at"):
        Deployment.parse_obj_clear({**base, "expires_at": base["issued_at"]}, source="deployment")


def test_an_unreadable_ledger_fails_closed(tmp_path: Path) -> None:
    (tmp_path / "command_sequence.json").write_text("{")
    error = refusal(gate(tmp_path), command(10**12))
    assert error.why == "replay" and "unreadable" in str(error)


def test_clock_skew_is_configured_in_the_agent_config() -> None:
    from edgesdk.schemas.agent_config import AgentConfig

    base = {"device_id": "dev-1", "profile": "rpi5-8gb"}
    assert AgentConfig.model_validate(base).ota.clock_skew_s == 300
    assert AgentConfig.model_validate({**base, "ota": {"clock_skew_s": 5}}).ota.clock_skew_s == 5
    for bad in (-1, 10**6):
        with pytest.raises(SchemaError, match="clock_skew_s"):
            AgentConfig.parse_obj_clear({**base, "ota": {"clock_skew_s": bad}}, source="agent config")
