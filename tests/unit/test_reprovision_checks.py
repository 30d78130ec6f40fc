"""The device's checks of a re-provision command (agent/ota/reprovision.py), in process: whose
keys may sign it (the carried trust document must chain from the image's root), the key-id
binding, the gate's time checks, a repeat that changes nothing, and the record it writes."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from edgesdk.agent.ota.reprovision import Reprovisioner, trust_keys
from edgesdk.agent.security_state import SecurityState, derive_state_key

from edgesdk.errors import TrustError
from edgesdk.keys import generate_publisher_key, key_id, load_publisher_private_key, load_publisher_public_key
from edgesdk.protocol.reprovision import Reprovision, sign_reprovision
from tests.trust_helpers import make_root, trust_document, write_document

DEVICE_KEY_ID = "ab" * 16


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    def emit(self, name: str, detail: dict) -> None:
        self.seen.append((name, detail))


@pytest.fixture
def fleet(tmp_path: Path) -> dict[str, Path]:
    root_key, root_pub = make_root(tmp_path / "root")
    old_op, old_op_pub = generate_publisher_key(tmp_path / "op-old")
    new_op, new_op_pub = generate_publisher_key(tmp_path / "op-new")
    _, publisher_pub = generate_publisher_key(tmp_path / "publisher")
    common = {"root_pubs": [root_pub], "publisher_pubs": [publisher_pub], "signers": [root_key]}
    image = write_document(trust_document(version=1, operator_pubs=[old_op_pub], **common), tmp_path / "image.json")
    newer = write_document(trust_document(version=2, operator_pubs=[new_op_pub], **common), tmp_path / "v2.json")
    return {"image": image, "v2": newer, "old_op": old_op, "new_op": new_op, "new_op_pub": new_op_pub}


def command(signer: Path, *, trust: Path | None = None, key: str = DEVICE_KEY_ID, ago_min: float = 0) -> Reprovision:
    now = datetime.now(timezone.utc) - timedelta(minutes=ago_min)
    unsigned = Reprovision(
        deployment_id="reprovision-1",
        issued_at=now,
        expires_at=now + timedelta(minutes=5),
        sequence=int(now.timestamp() * 1000),
        targets=["dev-1"],
        key_id=key,
        release_floors={"digits": 3},
        trust_document=trust.read_text() if trust is not None else None,
    )
    return sign_reprovision(unsigned, load_publisher_private_key(signer))


def write_json(path: Path, value: dict) -> Path:
    path.write_text(json.dumps(value))
    return path


def device(tmp_path: Path, image: Path) -> tuple[Reprovisioner, SecurityState, Events]:
    state = SecurityState(tmp_path / "data", lambda: derive_state_key(bytes(32)))
    events = Events()
    handler = Reprovisioner(
        device_id="dev-1",
        security=state,
        key_id=lambda: DEVICE_KEY_ID,
        operator_keys=trust_keys(image, lambda: []),
        gate_settings={"clock_skew_s": 60.0, "max_validity_s": 3600.0},
        events=events,
    )
    return handler, state, events


def test_a_carried_newer_trust_document_decides_who_may_sign(tmp_path: Path, fleet: dict[str, Path]) -> None:
    keys = trust_keys(fleet["image"], lambda: [])
    with_v2 = command(fleet["new_op"], trust=fleet["v2"])
    assert [key_id(k) for k in keys(with_v2)] == [key_id(load_publisher_public_key(fleet["new_op_pub"]))]
    forged = json.loads(fleet["v2"].read_text())
    forged["version"] = 3  # not what the root signed
    with pytest.raises(TrustError):
        keys(with_v2.model_copy(update={"trust_document": json.dumps(forged)}))


def test_the_signed_command_writes_the_stated_floors_and_the_carried_document(
    tmp_path: Path, fleet: dict[str, Path]
) -> None:
    handler, state, events = device(tmp_path, fleet["image"])
    signed = command(fleet["new_op"], trust=fleet["v2"])
    handler.handle(signed.model_dump_json().encode())
    assert [name for name, _ in events.seen] == ["security_state_reprovisioned"], events.seen
    record = state.read()
    assert record.release_floors == {"digits": 3} and record.trust_version == 2
    assert record.trust_document == fleet["v2"].read_text()
    assert {e.sequence for e in record.ledger.values()} == {signed.sequence}
    # The same message again (a QoS 1 redelivery) changes nothing, even after the floor rose.
    state.release_floor("digits").write(5)
    handler.handle(signed.model_dump_json().encode())
    assert state.read().release_floors == {"digits": 5} and len(events.seen) == 1


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("another device key", "not_addressed"),
        ("expired", "expired"),
        ("a revoked key, no document", "unknown_key"),
        ("a document the root did not sign", "trust_document"),
    ],
)
def test_refused_commands_write_nothing(tmp_path: Path, fleet: dict[str, Path], case: str, why: str) -> None:
    handler, state, events = device(tmp_path, fleet["image"])
    if case == "another device key":
        signed = command(fleet["old_op"], key="cd" * 16)
    elif case == "expired":
        signed = command(fleet["old_op"], ago_min=20)
    elif case == "a revoked key, no document":  # the image's document trusts old_op only
        signed = command(fleet["new_op"])
    else:
        forged = json.loads(fleet["v2"].read_text())
        forged["version"] = 3
        signed = command(fleet["new_op"], trust=write_json(tmp_path / "forged.json", forged))
    handler.handle(signed.model_dump_json().encode())
    assert [(name, detail["why"]) for name, detail in events.seen] == [("reprovision_refused", why)], events.seen
    assert not state.path.exists()


def test_a_healthy_device_is_never_lowered_by_a_reprovision(tmp_path: Path, fleet: dict[str, Path]) -> None:
    """With a valid record, the new one keeps the higher of each floor and the newer trust document."""
    handler, state, events = device(tmp_path, fleet["image"])
    handler.handle(command(fleet["new_op"], trust=fleet["v2"]).model_dump_json().encode())
    state.release_floor("digits").write(5)
    later = command(fleet["old_op"]).model_copy(update={"deployment_id": "reprovision-2"})
    later = sign_reprovision(
        later.model_copy(update={"sequence": later.sequence + 1}), load_publisher_private_key(fleet["old_op"])
    )
    handler.handle(later.model_dump_json().encode())
    assert [name for name, _ in events.seen] == ["security_state_reprovisioned"] * 2, events.seen
    record = state.read()
    assert record.release_floors == {"digits": 5} and record.trust_version == 2
