"""RollbackFloor: the anti-rollback floor survives the loss or corruption of any one file,
refuses to guess when nothing survives, and lowers only for a signed downgrade in range.

Write order (by reasoning, checked where a test can): ``committed()`` appends the counter
record (fsynced) before it writes the slot record (fsynced), and the store writes
``store.json`` only after both; so a crash at any point leaves the old floor or the new one,
never none. A torn append is a short tail the checksum rejects (tested below)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from edgesdk.agent.rollback_floor import (
    FLOOR_FILE,
    KIND_ADVANCE,
    RECORD_SIZE,
    FileCounter,
    FloorRecord,
    MonotonicCounter,
    RecordFile,
    RollbackFloor,
)

from edgesdk.errors import AgentError, RollbackFloorUnknownError


def device(tmp_path: Path) -> RollbackFloor:
    data = tmp_path / "data"
    for slot in ("a", "b"):
        (data / "slots" / slot).mkdir(parents=True, exist_ok=True)
    return RollbackFloor(data)


def commit(floor: RollbackFloor, slot: str, release: int, **kwargs) -> None:
    """What the store does: a bundle in the slot, the floor's commit, store.json."""
    (floor.data_dir / "slots" / slot / "bundle.edgepkg").write_bytes(b"bundle")
    floor.committed(slot, release, **kwargs)
    (floor.data_dir / "store.json").write_text(
        json.dumps({"active": slot, "committed": True, "slots": {slot: {"release": release, "good": True}}})
    )


def test_a_fresh_device_has_no_floor(tmp_path) -> None:
    assert device(tmp_path).floor() is None


def test_a_failed_first_install_leaves_the_device_fresh(tmp_path) -> None:
    floor = device(tmp_path)
    (floor.data_dir / "slots" / "a" / "bundle.edgepkg").write_bytes(b"staged, never proven")
    (floor.data_dir / "store.json").write_text(json.dumps({"active": "a", "slots": {"a": {"good": False}}}))
    assert floor.floor() is None


def test_commit_raises_the_floor_and_it_never_goes_down_by_itself(tmp_path) -> None:
    floor = device(tmp_path)
    commit(floor, "a", 3)
    commit(floor, "b", 5)
    assert floor.floor() == 5
    with pytest.raises(AgentError, match="release 4 is below the rollback floor 5 and carries no downgrade"):
        floor.committed("a", 4)
    assert floor.floor() == 5


@pytest.mark.parametrize("lost", ["floor file", "slot a record", "slot b record", "store.json"])
def test_the_floor_survives_the_loss_of_any_one_file(tmp_path, lost) -> None:
    floor = device(tmp_path)
    commit(floor, "a", 3)
    commit(floor, "b", 5)
    path = {
        "floor file": floor.data_dir / FLOOR_FILE,
        "slot a record": floor.data_dir / "slots" / "a" / "committed",
        "slot b record": floor.data_dir / "slots" / "b" / "committed",
        "store.json": floor.data_dir / "store.json",
    }[lost]
    path.unlink()
    assert floor.floor() == 5


@pytest.mark.parametrize("damage", ["garbage", "flipped bit", "truncated"])
def test_the_floor_survives_a_corrupt_floor_file(tmp_path, damage) -> None:
    floor = device(tmp_path)
    commit(floor, "a", 3)
    commit(floor, "b", 5)
    path = floor.data_dir / FLOOR_FILE
    data = bytearray(path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"{" * len(data))
    elif damage == "flipped bit":
        data[RECORD_SIZE + 20] ^= 0x01  # inside the second record's value
    else:
        data = data[: RECORD_SIZE + 10]
    path.write_bytes(bytes(data))
    assert floor.floor() == 5  # the slot record of b still says 5


def test_when_nothing_survives_installs_are_refused_not_reset(tmp_path) -> None:
    floor = device(tmp_path)
    commit(floor, "a", 3)
    commit(floor, "b", 5)
    for path in (floor.data_dir / FLOOR_FILE, floor.data_dir / "store.json"):
        path.unlink()
    for slot in ("a", "b"):
        (floor.data_dir / "slots" / slot / "committed").write_bytes(b"\0" * RECORD_SIZE)  # rotted
    with pytest.raises(RollbackFloorUnknownError, match="no intact record of the release installed"):
        floor.floor()


def test_slots_with_bundles_and_no_records_or_store_are_not_a_fresh_device(tmp_path) -> None:
    floor = device(tmp_path)
    commit(floor, "a", 3)
    for path in (floor.data_dir / FLOOR_FILE, floor.data_dir / "store.json", floor.data_dir / "slots/a/committed"):
        path.unlink()
    with pytest.raises(RollbackFloorUnknownError, match="slot a holds a bundle and store.json is missing"):
        floor.floor()


def test_a_torn_append_keeps_the_earlier_records_and_the_next_append_realigns(tmp_path) -> None:
    records = RecordFile(tmp_path / FLOOR_FILE)
    records.append(FloorRecord(KIND_ADVANCE, 4))
    with open(records.path, "ab") as handle:  # power cut in the middle of the next append
        handle.write(FloorRecord(KIND_ADVANCE, 9).pack()[:40])
    assert [r.value for r in records.records()] == [4]
    records.append(FloorRecord(KIND_ADVANCE, 6))
    assert [r.value for r in records.records()] == [4, 6]
    assert records.path.stat().st_size == 3 * RECORD_SIZE


def test_a_record_is_checksummed_and_fixed_size() -> None:
    raw = FloorRecord(KIND_ADVANCE, 7).pack()
    assert len(raw) == RECORD_SIZE
    assert FloorRecord.unpack(raw) == FloorRecord(KIND_ADVANCE, 7)
    for offset in range(0, RECORD_SIZE, 7):
        damaged = bytearray(raw)
        damaged[offset] ^= 0x80
        assert FloorRecord.unpack(bytes(damaged)) is None, offset


def test_signed_downgrade_lowers_the_floor_and_the_next_update_works(tmp_path) -> None:
    floor = device(tmp_path)
    commit(floor, "a", 3)
    commit(floor, "b", 5)
    with pytest.raises(AgentError, match="no downgrade permission"):
        floor.committed("a", 2, downgrade_from=(6, 9))  # the range does not hold the floor
    commit(floor, "a", 2, downgrade_from=(4, 6), evidence=b"\x11" * 32)
    assert floor.floor() == 2  # slot b still holds 5: the lowering covers it
    lowering = floor.lowering(floor.counter.read())
    assert lowering is not None and lowering.from_releases == (4, 6) and lowering.evidence == b"\x11" * 32
    floor.slot_staging("b")
    commit(floor, "b", 4)  # the next normal update, still under the counter (5)
    assert floor.floor() == 4
    commit(floor, "a", 7)
    assert floor.floor() == 7 and floor.lowering(floor.counter.read()) is None


def test_losing_a_lowering_fails_closed(tmp_path) -> None:
    floor = device(tmp_path)
    commit(floor, "a", 3)
    commit(floor, "b", 5)
    commit(floor, "a", 2, downgrade_from=(5, 5))
    (floor.data_dir / FLOOR_FILE).unlink()
    assert floor.floor() == 5  # slot b's record: back to the higher floor, never lower


class MemoryCounter:
    """A stand-in for a hardware counter (TPM NV / RPMB): only ever increments."""

    def __init__(self) -> None:
        self.value: int | None = None
        self.increments = 0

    def read(self) -> int | None:
        return self.value

    def advance(self, to: int) -> None:
        while self.value is None or self.value < to:
            self.value = 0 if self.value is None else self.value + 1
            self.increments += 1


def test_the_counter_is_a_port(tmp_path) -> None:
    counter = MemoryCounter()
    port: MonotonicCounter = counter  # the Protocol: read() and advance(to)
    data = tmp_path / "data"
    (data / "slots" / "a").mkdir(parents=True)
    floor = RollbackFloor(data, counter=port)
    floor.committed("a", 3)
    assert counter.value == 3 and floor.floor() == 3
    # Nothing of the counter went into the file: the file holds only lowerings then.
    assert not (data / FLOOR_FILE).exists()
    floor.committed("a", 2, downgrade_from=(3, 3))
    assert floor.floor() == 2 and counter.value == 3
    counter.advance(1)  # a counter never goes down
    assert counter.value == 3


def test_file_counter_is_monotonic(tmp_path) -> None:
    counter = FileCounter(RecordFile(tmp_path / FLOOR_FILE))
    assert counter.read() is None
    counter.advance(5)
    counter.advance(3)
    assert counter.read() == 5
    assert (tmp_path / FLOOR_FILE).stat().st_size == RECORD_SIZE  # the no-op wrote nothing
