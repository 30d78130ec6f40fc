"""The device's security state record (agent/security_state.py): made with the device key,
used when its MAC holds, tampered when it is missing (whatever else is left) or edited;
the floor and ledger ports read and write through it."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import pytest
from edgesdk.agent.ota.freshness import Admission, CommandRefused, SequenceLedger
from edgesdk.agent.rollback_floor import RollbackFloor
from edgesdk.agent.security_state import (
    STATE_FILE,
    RecordLedgerStore,
    SecurityRecord,
    SecurityState,
    SecurityStateError,
    derive_state_key,
)

from edgesdk.errors import AgentError, RollbackFloorUnknownError

KEY = bytes(range(32))


def state(data_dir: Path, key: bytes = KEY) -> SecurityState:
    return SecurityState(data_dir, lambda: derive_state_key(key))


def test_derive_state_key_is_rfc5869_hkdf_sha256() -> None:
    # RFC 5869 with a zero salt, one block: T(1) = HMAC(PRK, info || 0x01).
    prk = hmac.new(b"\0" * 32, KEY, hashlib.sha256).digest()
    expected = hmac.new(prk, b"edgesdk security state\x01", hashlib.sha256).digest()
    assert derive_state_key(KEY) == expected and len(expected) == 32
    assert derive_state_key(bytes(32)) != expected


def test_the_record_made_with_the_device_key_is_used_at_the_next_start(tmp_path: Path) -> None:
    state(tmp_path).create()
    assert state(tmp_path).open() == "ok"
    assert state(tmp_path).read() == SecurityRecord()
    assert (tmp_path / STATE_FILE).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("left", ["nothing", "trust.json", "ota/command_sequence.json", "models/digits/rollback_floor"])
def test_a_device_key_without_its_record_is_tampered_whatever_else_is_left(tmp_path: Path, left: str) -> None:
    """The strict rule: the record is made with the key, so a missing one was deleted, even
    when every other piece of state went with it (it used to look like a first start)."""
    if left != "nothing":
        (tmp_path / left).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / left).write_text("{}")
    checked = state(tmp_path)
    assert checked.open() == "tampered"
    assert checked.problem is not None and "missing beside the device key" in checked.problem
    assert not (tmp_path / STATE_FILE).exists()  # never created over the evidence
    with pytest.raises(SecurityStateError, match="edge-agent security-state seed"):
        checked.read()


@pytest.mark.parametrize("damage", ["edited", "other key", "not json", "no mac"])
def test_an_edited_record_or_one_of_another_device_key_is_tampered(tmp_path: Path, damage: str) -> None:
    state(tmp_path).create()
    state(tmp_path).release_floor("digits").write(3)
    path = tmp_path / STATE_FILE
    document = json.loads(path.read_text())
    if damage == "edited":
        document["record"]["release_floors"]["digits"] = 1
        path.write_text(json.dumps(document))
    elif damage == "not json":
        path.write_text("{")
    elif damage == "no mac":
        del document["mac"]
        path.write_text(json.dumps(document))
    key = bytes(32) if damage == "other key" else KEY
    checked = state(tmp_path, key)
    assert checked.open() == "tampered"
    floor = RollbackFloor(tmp_path / "models" / "digits", recorded=checked.release_floor("digits"))
    with pytest.raises(RollbackFloorUnknownError, match="security state"):
        floor.floor()


def test_the_recorded_floor_holds_when_the_model_files_are_gone_and_follows_commits(tmp_path: Path) -> None:
    security = state(tmp_path)
    security.create()
    model_dir = tmp_path / "models" / "digits"
    (model_dir / "slots" / "a").mkdir(parents=True)
    floor = RollbackFloor(model_dir, recorded=security.release_floor("digits"))
    assert floor.floor() is None
    floor.committed("a", 3)
    assert security.read().release_floors == {"digits": 3}
    (model_dir / "rollback_floor").unlink()
    (model_dir / "slots" / "a" / "committed").unlink()
    assert floor.floor() == 3  # the record alone
    assert RollbackFloor(model_dir).floor() is None  # what the files alone say now


def test_the_ledger_lives_in_the_record(tmp_path: Path) -> None:
    security = state(tmp_path)
    security.create()
    ledger = SequenceLedger(tmp_path / "ota" / "command_sequence.json", store=RecordLedgerStore(security))
    assert ledger.admit("op", 5, "sig-5", what="install 'a'") is Admission.ACT
    assert not (tmp_path / "ota" / "command_sequence.json").exists()
    again = SequenceLedger(tmp_path / "elsewhere.json", store=RecordLedgerStore(security))
    assert again.last("op") == 5
    with pytest.raises(CommandRefused, match="not above the last accepted 5"):
        again.admit("op", 4, "sig-4", what="install 'b'")
    (tmp_path / STATE_FILE).unlink()
    with pytest.raises(CommandRefused, match="security state"):
        again.admit("op", 6, "sig-6", what="install 'c'")


def test_seed_never_replaces_a_valid_record_unless_asked(tmp_path: Path) -> None:
    security = state(tmp_path)
    security.create()
    with pytest.raises(AgentError, match="present and valid"):
        security.seed(SecurityRecord(release_floors={"digits": 1}))
    security.seed(SecurityRecord(release_floors={"digits": 1}), replace_valid=True)
    assert security.read().release_floors == {"digits": 1}
