"""Capture files uploaded by devices (issue 41): stored, listed and handed out as they came.

A capture file is sealed on the device to the operator's X25519 key; the service never holds the
private key, so it stores the bytes opaquely beside what the device said in the clear (model, file
name) and what it checked itself (size, SHA-256 of the bytes, the time it received them). The
SHA-256 is checked on arrival (``CaptureUpload.content``); a file over ``max_file_bytes`` is
refused before it is queued, and each device keeps at most ``quota_bytes``: storing a new file
deletes that device's oldest until the rest fit (counted). A redelivered upload (QoS 1, the
device's outbox after a restart) has the same SHA-256 and is stored once.

A file over one message comes in chunks (``CaptureUpload.chunk``): each is kept in
``capture_parts`` until the last one arrives, then the whole file's SHA-256 is checked and the
file stored once (a chunk that comes again is one row; a file whose bytes do not match is dropped,
``capture_corrupt``). Uploads in chunks are bounded: at most ``MAX_OPEN_PER_DEVICE`` files of a
device and ``MAX_OPEN_UPLOADS`` in all arrive at once (the first chunk of one more is refused,
``capture_refused``), and one with no new chunk for ``PART_TIMEOUT_S`` is dropped
(``capture_expired``): the service's disk holds at most ``MAX_OPEN_UPLOADS`` × the size cap of
partial files. Every file the service holds after a batch, stored or already there, is named in
``CaptureWrite.held``: the ingest acknowledges it to the device, which then deletes its copy.

The bytes are kept in the database, not in files beside it as bundles are: captures are small
(one request each) and written by the ingest, which may run as several
worker processes on other hosts (``fleet serve --workers``); in the database every worker and
every replica of the API sees them, and a backup of the database holds them.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from edgesdk.capture.upload import CaptureUpload
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction, insert_ignoring_duplicates, inserted_new_row

#: Capture bytes kept per device by default; the oldest go first.
DEFAULT_QUOTA_BYTES = 256 * 1024 * 1024
#: The largest capture file taken by default (one that large arrives in 128 chunks).
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
#: Files arriving in chunks at once, per device and in all.
MAX_OPEN_PER_DEVICE = 4
MAX_OPEN_UPLOADS = 64
#: An upload in chunks with no new chunk for this long is dropped (the device keeps its copy).
PART_TIMEOUT_S = 6 * 3600.0
#: How often the writer looks for idle uploads to drop.
_SWEEP_EVERY_S = 60.0
#: Rows one list answer holds at most (newest first).
MAX_LISTED = 1000

_LISTED = ("id", "device_id", "model", "name", "size", "sha256", "received")


@dataclass(frozen=True)
class Capture:
    """A stored capture: the decoded upload and its bytes."""

    upload: CaptureUpload
    content: bytes


@dataclass(frozen=True)
class CapturePart:
    """One checked chunk of a file that arrives in several (``content``: this chunk's bytes)."""

    upload: CaptureUpload
    content: bytes


@dataclass
class CaptureWrite:
    """What one batch's captures and chunks came to."""

    stored: int = 0
    evicted: int = 0  # for a device's quota
    duplicates: int = 0  # files (or chunks) already held
    refused: int = 0  # first chunks of an upload beyond the open uploads allowed
    corrupt: int = 0  # files whose chunks did not make the SHA-256 they declared
    expired: int = 0  # uploads in chunks idle past PART_TIMEOUT_S
    held: list[tuple[str, str]] = field(default_factory=list)  # (device, sha256) now stored: to acknowledge


class CaptureStore:
    """Writes captures inside the ingest's transaction; the per-device quota applied at once."""

    def __init__(
        self,
        engine: Any,
        *,
        quota_bytes: int = DEFAULT_QUOTA_BYTES,
        part_timeout_s: float = PART_TIMEOUT_S,
        max_open_per_device: int = MAX_OPEN_PER_DEVICE,
        max_open: int = MAX_OPEN_UPLOADS,
    ) -> None:
        self.quota_bytes = quota_bytes
        self.part_timeout_s = part_timeout_s
        self.max_open_per_device = max_open_per_device
        self.max_open = max_open
        self._insert = insert_ignoring_duplicates(engine, schema.captures)
        self._insert_part = insert_ignoring_duplicates(engine, schema.capture_parts)
        self._postgres = engine.dialect.name == "postgresql"
        self._swept = 0.0

    def write(self, db: Any, captures: list[Capture], parts: list[CapturePart] | None = None) -> CaptureWrite:
        """Store ``captures`` and the ``parts`` of files in chunks (each file once it is whole)."""
        result = CaptureWrite()
        devices = set()
        for capture in captures:
            if self._store_file(db, capture.upload, capture.content, result):
                devices.add(capture.upload.device_id)
        for part in sorted(parts or [], key=lambda p: (p.upload.device_id, p.upload.sha256, p.upload.index)):
            if self._store_part(db, part, result):
                devices.add(part.upload.device_id)
        if parts and time.monotonic() - self._swept > _SWEEP_EVERY_S:
            self._swept = time.monotonic()
            result.expired += self.expire(db, time.time())
        result.evicted = sum(self._enforce_quota(db, device) for device in sorted(devices))
        return result

    def expire(self, db: Any, now: float) -> int:
        """Drop the uploads in chunks with no new chunk since ``now - part_timeout_s``; how many."""
        table = schema.capture_parts
        idle = (
            sa.select(table.c.device_id, table.c.sha256)
            .group_by(table.c.device_id, table.c.sha256)
            .having(sa.func.max(table.c.received) < now - self.part_timeout_s)
        )
        uploads = db.execute(idle).all()
        for device_id, sha256 in uploads:
            db.execute(table.delete().where((table.c.device_id == device_id) & (table.c.sha256 == sha256)))
        return len(uploads)

    def _store_file(self, db: Any, upload: CaptureUpload, content: bytes, result: CaptureWrite) -> bool:
        """Insert one whole file; True when it is new (a duplicate is counted, and held all the same)."""
        row = {
            "device_id": upload.device_id,
            "model": upload.model,
            "name": upload.name,
            "size": upload.size,
            "sha256": upload.sha256,
            "received": time.time(),
            "data": content,
        }
        result.held.append((upload.device_id, upload.sha256))
        if inserted_new_row(db, self._insert.values(**row), schema.captures.c.id):
            result.stored += 1
            return True
        result.duplicates += 1
        return False

    def _store_part(self, db: Any, part: CapturePart, result: CaptureWrite) -> bool:
        """Keep one chunk; store its file once every chunk is here. True when a file was stored."""
        upload = part.upload
        if self._postgres:  # two workers storing the last two chunks at once: one waits, then sees both
            key = int(hashlib.sha256(f"{upload.device_id}/{upload.sha256}".encode()).hexdigest()[:15], 16)
            db.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        if self._holds(db, upload.device_id, upload.sha256):  # a chunk resent after the file was stored
            result.duplicates += 1
            result.held.append((upload.device_id, upload.sha256))
            return False
        table = schema.capture_parts
        mine = (table.c.device_id == upload.device_id) & (table.c.sha256 == upload.sha256)
        if db.execute(sa.select(table.c.idx).where(mine).limit(1)).first() is None and self._full(db, upload.device_id):
            result.refused += 1
            return False
        row = {
            "device_id": upload.device_id,
            "sha256": upload.sha256,
            "idx": upload.index,
            "count": upload.count,
            "size": upload.size,
            "model": upload.model,
            "name": upload.name,
            "received": time.time(),
            "data": part.content,
        }
        if not inserted_new_row(db, self._insert_part.values(**row), table.c.idx):
            result.duplicates += 1
        chunks = db.execute(sa.select(table.c.idx, table.c.data).where(mine).order_by(table.c.idx)).all()
        if len(chunks) < upload.count:
            return False
        db.execute(table.delete().where(mine))
        content = b"".join(bytes(chunk.data) for chunk in chunks)
        whole = [chunk.idx for chunk in chunks] == list(range(upload.count)) and len(content) == upload.size
        if not whole or hashlib.sha256(content).hexdigest() != upload.sha256:
            result.corrupt += 1
            return False
        return self._store_file(db, upload, content, result)

    def _holds(self, db: Any, device_id: str, sha256: str) -> bool:
        table = schema.captures
        found = sa.select(table.c.id).where((table.c.device_id == device_id) & (table.c.sha256 == sha256))
        return db.execute(found.limit(1)).first() is not None

    def _full(self, db: Any, device_id: str) -> bool:
        """Whether one more upload in chunks would be over the device's or the service's bound."""
        table = schema.capture_parts
        uploads = sa.select(table.c.device_id, table.c.sha256).distinct()
        per_device = sa.select(sa.func.count()).select_from(uploads.where(table.c.device_id == device_id).subquery())
        if db.execute(per_device).scalar_one() >= self.max_open_per_device:
            return True
        return db.execute(sa.select(sa.func.count()).select_from(uploads.subquery())).scalar_one() >= self.max_open

    def _enforce_quota(self, db: Any, device_id: str) -> int:
        """Delete the device's oldest captures until the rest fit the quota; how many went."""
        table = schema.captures
        rows = db.execute(
            sa.select(table.c.id, table.c.size).where(table.c.device_id == device_id).order_by(table.c.id.desc())
        ).all()
        total = 0
        doomed = []
        for row in rows:  # newest first: keep while they fit
            total += row.size
            if total > self.quota_bytes:
                doomed.append(row.id)
        if doomed:
            db.execute(table.delete().where(table.c.id.in_(doomed)))
        return len(doomed)


def list_captures(engine: Any, device_id: str) -> list[dict[str, Any]]:
    """The device's captures, newest first (at most ``MAX_LISTED``), without their bytes."""
    table = schema.captures
    columns = [table.c[name] for name in _LISTED]
    query = sa.select(*columns).where(table.c.device_id == device_id).order_by(table.c.id.desc()).limit(MAX_LISTED)
    with Transaction(engine) as db:
        return [dict(row._mapping) for row in db.execute(query)]


def read_capture(engine: Any, capture_id: int) -> tuple[str, bytes] | None:
    """A capture's file name and bytes, or None when there is no such capture."""
    table = schema.captures
    with Transaction(engine) as db:
        row = db.execute(sa.select(table.c.name, table.c.data).where(table.c.id == capture_id)).first()
    return None if row is None else (row.name, bytes(row.data))
