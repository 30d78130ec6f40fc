"""The anti-rollback floor: the lowest release this device may install, kept so that losing
or corrupting any one file cannot lower it.

Where the floor comes from (each source on its own can establish it):

* a **monotonic counter** (:class:`MonotonicCounter`): the highest release this device ever
  committed. The default, :class:`FileCounter`, appends fixed-size checksummed records to
  ``rollback_floor`` in the data dir and fsyncs each one; a torn or rotted record is
  skipped, the others still count. The port exists so that a device with tamper-resistant
  storage can keep the counter there instead: a **TPM 2.0 NV counter**
  (``TPM2_NV_Increment`` on an index defined with ``TPMA_NV_COUNTER``; it can only grow,
  so ``advance(to)`` increments until it reaches ``to``) or an **eMMC RPMB** block (an
  authenticated write counter and HMAC-keyed blocks the host cannot roll back). Neither is
  implemented yet; both fit the two methods below.
* a **committed-release record per slot** (``slots/a/committed``, ``slots/b/committed``),
  written when that slot commits, in the same record format. They survive the loss of
  ``rollback_floor`` and of ``store.json``.
* **lowering records** in ``rollback_floor``: a signed, bounded downgrade (the manifest's
  ``downgrade`` permission) that committed. A lowering is bound to the counter value it
  lowered (a counter cannot go down, so the floor is "counter, unless a lowering made at
  this counter value says less"); once a newer release commits and the counter passes it,
  the lowering no longer applies. Losing the lowering raises the floor back to the counter:
  fail closed (an update is refused, nothing older gets in).

The floor is the largest value the surviving sources give (a slot's committed release above
the counter raises it; a slot release a lowering covers does not). When nothing can establish
it on a device that has installed something before (a slot holds a bundle, the record file
exists but every record is corrupt, or ``store.json`` is unreadable or names a proven slot),
:meth:`RollbackFloor.floor` raises :class:`~edgesdk.errors.RollbackFloorUnknownError`:
installs are refused and the agent reports it. It never falls back to "no floor". A device
that has never installed anything has no floor (``None``).

Write order on commit (each step fsynced before the next): counter (or lowering record),
then the slot's committed record, then ``store.json``. A crash between steps leaves the
floor at the new release with the store still uncommitted; the commit is repeated on
resume and is idempotent. A crash inside an append leaves a torn last record, which the
checksum rejects: the previous records still hold the old floor.

The agent also keeps each model's floor in the device's security state
(:mod:`edgesdk.agent.security_state`, the ``recorded`` port): an authenticated record outside
the model's directory, so deleting that directory, or every file above, lowers nothing; the
floor is the larger of the record and the files.

On threat model: with the file-backed counter these defend against loss and corruption (a
bad disk, a truncated or deleted file) and against an attacker who can only offer bundles;
someone who can rewrite every file in the data dir is out of scope until a hardware counter
is plugged in (and then lowering records would need their signed evidence checked on read:
they carry the downgrade bundle's front SHA-256 for that).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from edgesdk.agent.fsutil import fsync_dir

from edgesdk.errors import AgentError, RollbackFloorUnknownError

log = logging.getLogger("edgesdk.agent.rollback_floor")

FLOOR_FILE = "rollback_floor"
SLOT_RECORD_FILE = "committed"

_MAGIC = b"EFLR"
_FORMAT_VERSION = 1
#: magic, format, kind, 2 pad, value, counter_at, range lo, range hi, evidence, 8 pad
_BODY = struct.Struct("<4sBB2xQQQQ32s8x")
_CHECKSUM_BYTES = 16
RECORD_SIZE = _BODY.size + _CHECKSUM_BYTES  # 96

KIND_ADVANCE = 1  # the counter reached ``value``
KIND_LOWER = 2  # a signed downgrade lowered the floor to ``value`` while the counter stood at ``counter_at``
KIND_SLOT = 3  # this slot committed release ``value``


@dataclass(frozen=True)
class FloorRecord:
    """One fixed-size record. ``evidence`` is the SHA-256 of the signed bundle front that
    justified it (zeros when none); ``range_lo``/``range_hi`` the downgrade's ``from_releases``."""

    kind: int
    value: int
    counter_at: int = 0
    range_lo: int = 0
    range_hi: int = 0
    evidence: bytes = b"\0" * 32

    def pack(self) -> bytes:
        body = _BODY.pack(
            _MAGIC, _FORMAT_VERSION, self.kind, self.value, self.counter_at, self.range_lo, self.range_hi, self.evidence
        )
        return body + hashlib.sha256(body).digest()[:_CHECKSUM_BYTES]

    @classmethod
    def unpack(cls, raw: bytes) -> FloorRecord | None:
        """The record in ``raw``, or None when it is torn, rotted or not a record at all."""
        if len(raw) != RECORD_SIZE:
            return None
        body, checksum = raw[: _BODY.size], raw[_BODY.size :]
        if hashlib.sha256(body).digest()[:_CHECKSUM_BYTES] != checksum:
            return None
        magic, version, kind, value, counter_at, lo, hi, evidence = _BODY.unpack(body)
        if magic != _MAGIC or version != _FORMAT_VERSION or kind not in (KIND_ADVANCE, KIND_LOWER, KIND_SLOT):
            return None
        return cls(kind, value, counter_at, lo, hi, evidence)


class RecordFile:
    """An append-only file of :class:`FloorRecord` s, each write fsynced on its own.

    Records sit at multiples of :data:`RECORD_SIZE`; a short tail (a torn append) or a record
    whose checksum fails is skipped, so one bad record never hides the others."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def exists(self) -> bool:
        return self.path.exists()

    def records(self) -> list[FloorRecord]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.error("rollback floor record %s unreadable: %s", self.path, exc)
            return []
        found = []
        for start in range(0, len(data) - RECORD_SIZE + 1, RECORD_SIZE):
            record = FloorRecord.unpack(data[start : start + RECORD_SIZE])
            if record is None:
                log.error("rollback floor record %s: record at byte %d is corrupt; skipped", self.path, start)
            else:
                found.append(record)
        return found

    def append(self, record: FloorRecord) -> None:
        created = not self.path.exists()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size % RECORD_SIZE:
                    # A torn append left a partial record: pad it out so later records stay aligned.
                    os.write(fd, b"\0" * (RECORD_SIZE - size % RECORD_SIZE))
                os.write(fd, record.pack())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise AgentError(f"cannot write the rollback floor record {self.path}: {exc.strerror or exc}") from exc
        if created:
            fsync_dir(self.path.parent)

    def replace(self, record: FloorRecord) -> None:
        """Make ``record`` the file's only record (a slot's record, rewritten on each commit)."""
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, record.pack())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise AgentError(f"cannot write the slot record {self.path}: {exc.strerror or exc}") from exc
        fsync_dir(self.path.parent)

    def remove(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise AgentError(f"cannot remove the slot record {self.path}: {exc.strerror or exc}") from exc
        fsync_dir(self.path.parent)


class MonotonicCounter(Protocol):
    """A counter that never goes down: the highest release this device committed.

    ``read()`` returns the value, or None when the counter holds nothing readable (never
    written, or its storage lost). ``advance(to)`` raises it to ``to`` (no-op when it is
    already there or above) and returns only once the new value is durable; it raises
    :class:`~edgesdk.errors.AgentError` when it cannot. Backends: :class:`FileCounter`
    (default); a TPM 2.0 NV counter or eMMC RPMB would implement the same two methods."""

    def read(self) -> int | None: ...

    def advance(self, to: int) -> None: ...


class FileCounter:
    """The default counter: ADVANCE records in the floor record file; the value is the
    largest intact one."""

    def __init__(self, records: RecordFile) -> None:
        self._records = records

    def read(self) -> int | None:
        values = [r.value for r in self._records.records() if r.kind == KIND_ADVANCE]
        return max(values) if values else None

    def advance(self, to: int) -> None:
        current = self.read()
        if current is not None and current >= to:
            return
        self._records.append(FloorRecord(KIND_ADVANCE, to))


@dataclass(frozen=True)
class Lowering:
    """A signed downgrade that committed: the floor is ``to`` while the counter is ``counter_at``."""

    to: int
    counter_at: int
    from_releases: tuple[int, int]
    evidence: bytes


class RecordedFloor(Protocol):
    """The model's floor as the device's security state records it
    (:class:`edgesdk.agent.security_state.ModelFloorRecord`): authenticated and kept outside the
    model's directory, so deleting that directory cannot lower it. ``read`` is None for a model
    that never committed and raises :class:`~edgesdk.errors.AgentError` when the record is
    missing or invalid (a tampered device)."""

    def read(self) -> int | None: ...

    def write(self, value: int) -> None: ...


class RollbackFloor:
    """The floor of one device's data dir: :meth:`floor` to read it, :meth:`committed` when a
    slot commits (raises it, or lowers it for a signed downgrade).

    With ``recorded`` (the security state's floor of this model) the floor is the larger of the
    record and these files, and the record alone holds it when the files are gone."""

    def __init__(
        self,
        data_dir: Path,
        slots: Sequence[str] = ("a", "b"),
        *,
        counter: MonotonicCounter | None = None,
        bundle_file: str = "bundle.edgepkg",
        state_file: str = "store.json",
        recorded: RecordedFloor | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.recorded = recorded
        self.records = RecordFile(self.data_dir / FLOOR_FILE)
        self.counter: MonotonicCounter = counter if counter is not None else FileCounter(self.records)
        self._slots = tuple(slots)
        self._bundle_file = bundle_file
        self._state_file = state_file

    def _slot_record(self, slot: str) -> RecordFile:
        return RecordFile(self.data_dir / "slots" / slot / SLOT_RECORD_FILE)

    def _slot_releases(self) -> Iterator[int]:
        for slot in self._slots:
            for record in self._slot_record(slot).records():
                if record.kind == KIND_SLOT:
                    yield record.value

    def lowering(self, counter: int | None) -> Lowering | None:
        """The lowering in force at counter value ``counter`` (the latest made there), if any."""
        if counter is None:
            return None
        found = None
        for record in self.records.records():
            if record.kind == KIND_LOWER and record.counter_at == counter:
                found = record
        if found is None:
            return None
        return Lowering(found.value, found.counter_at, (found.range_lo, found.range_hi), found.evidence)

    def floor(self) -> int | None:
        """The lowest release this device may install; None on a device that never installed.

        Raises RollbackFloorUnknownError when the device has installed before but no record
        survives to say what, or when the security state is missing or invalid."""
        if self.recorded is None:
            return self._file_floor()
        try:
            recorded = self.recorded.read()
        except AgentError as exc:
            raise RollbackFloorUnknownError(f"rollback floor cannot be established: {exc}") from exc
        try:
            files = self._file_floor()
        except RollbackFloorUnknownError:
            if recorded is None:
                raise
            return recorded  # the record is the authority; the files only add a crash window's commit
        candidates = [value for value in (recorded, files) if value is not None]
        return max(candidates) if candidates else None

    def _file_floor(self) -> int | None:
        counter = self.counter.read()
        lowering = self.lowering(counter)
        candidates = [] if counter is None else [lowering.to if lowering else counter]
        for release in self._slot_releases():
            if counter is not None and release <= counter:
                # At or under the counter: the counter (or a signed lowering made there) decides.
                continue
            candidates.append(release)
        if candidates:
            return max(candidates)
        evidence = self._installed_before()
        if evidence:
            raise RollbackFloorUnknownError(
                f"rollback floor cannot be established: {evidence}, but no intact record of the release "
                f"installed survives ({self.records.path}, slots/*/{SLOT_RECORD_FILE}); installs are refused "
                "until the device is re-provisioned"
            )
        return None

    def _installed_before(self) -> str | None:
        """Why this device must have had a floor (what it has installed), or None for a fresh one."""
        if self.records.exists():
            return f"{self.records.path} exists but holds no intact record"
        for slot in self._slots:
            if self._slot_record(slot).exists():
                return f"slots/{slot}/{SLOT_RECORD_FILE} exists but holds no intact record"
        bundles = [s for s in self._slots if (self.data_dir / "slots" / s / self._bundle_file).exists()]
        if not bundles:
            return None
        # A bundle was staged. If store.json is intact and no slot ever proved itself, this is
        # a device whose first install failed: still fresh. Otherwise something committed.
        state_path = self.data_dir / self._state_file
        try:
            state = json.loads(state_path.read_text())
            slots = state["slots"]
            proven = [name for name, info in slots.items() if info.get("good")] or (
                [state["active"]] if state.get("committed") else []
            )
        except FileNotFoundError:
            return f"slot {bundles[0]} holds a bundle and {self._state_file} is missing"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"slot {bundles[0]} holds a bundle and {self._state_file} is unreadable"
        if proven:
            return f"slot {proven[0]} committed a bundle"
        return None

    # -- changes ------------------------------------------------------------------------------

    def slot_staging(self, slot: str) -> None:
        """``slot``'s old content is about to be replaced: its committed record goes first."""
        self._slot_record(slot).remove()

    def committed(
        self,
        slot: str,
        release: int,
        *,
        downgrade_from: tuple[int, int] | None = None,
        evidence: bytes = b"\0" * 32,
    ) -> None:
        """``slot`` committed ``release``: raise the floor to it, or, when the release is below
        the floor and the bundle carries a signed downgrade permission for the current floor
        (checked again here), record the lowering. Durable before it returns."""
        try:
            current = self.floor()
        except RollbackFloorUnknownError:
            current = None  # the install was checked against the floor; the commit re-establishes it
        counter = self.counter.read()
        if current is not None and release < current:
            if downgrade_from is None or not (downgrade_from[0] <= current <= downgrade_from[1]):
                raise AgentError(
                    f"slot {slot}: release {release} is below the rollback floor {current} and carries no "
                    "downgrade permission for it; not committed"
                )
            if counter is None:
                # The floor came from slot records only: pin it in the counter first, so the
                # lowering is bound to a value that survives.
                self.counter.advance(current)
                counter = current
            self.records.append(
                FloorRecord(KIND_LOWER, release, counter, downgrade_from[0], downgrade_from[1], evidence)
            )
            log.warning("rollback floor lowered from %d to %d by a signed downgrade", current, release)
        elif counter is not None and release <= counter:
            lowering = self.lowering(counter)
            if lowering is not None and release > lowering.to:
                # A newer release after a downgrade, still under the counter: move the lowering up.
                self.records.append(
                    FloorRecord(KIND_LOWER, release, counter, *lowering.from_releases, evidence=lowering.evidence)
                )
        else:
            self.counter.advance(release)
        self._slot_record(slot).replace(FloorRecord(KIND_SLOT, release))
        if self.recorded is not None:
            # After any commit that got here the floor is ``release`` (raised to it, or lowered to
            # it by a signed downgrade). The files are written first: a crash in between leaves
            # the higher of the two in force, fail closed, and the repeated commit writes it.
            self.recorded.write(release)
