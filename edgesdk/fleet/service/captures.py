"""Capture files uploaded by devices (issue 41): stored, listed and handed out as they came.

A capture file is sealed on the device to the operator's X25519 key; the service never holds the
private key, so it stores the bytes opaquely beside what the device said in the clear (model, file
name) and what it checked itself (size, SHA-256 of the bytes, the time it received them). The
SHA-256 is checked on arrival (``CaptureUpload.content``); a file over ``max_file_bytes`` is
refused before it is queued, and each device keeps at most ``quota_bytes``: storing a new file
deletes that device's oldest until the rest fit (counted). A redelivered upload (QoS 1, the
device's outbox after a restart) has the same SHA-256 and is stored once.

The bytes are kept in the database, not in files beside it as bundles are: captures are small
(one request each, at most one message) and written by the ingest, which may run as several
worker processes on other hosts (``fleet serve --workers``); in the database every worker and
every replica of the API sees them, and a backup of the database holds them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from edgesdk.capture.upload import MAX_UPLOAD_BYTES, CaptureUpload
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction, insert_ignoring_duplicates, inserted_new_row

#: Capture bytes kept per device by default; the oldest go first.
DEFAULT_QUOTA_BYTES = 256 * 1024 * 1024
#: The largest capture file taken by default: what one device message carries.
DEFAULT_MAX_FILE_BYTES = MAX_UPLOAD_BYTES
#: Rows one list answer holds at most (newest first).
MAX_LISTED = 1000

_LISTED = ("id", "device_id", "model", "name", "size", "sha256", "received")


@dataclass(frozen=True)
class Capture:
    """A stored capture: the decoded upload and its bytes."""

    upload: CaptureUpload
    content: bytes


class CaptureStore:
    """Writes captures inside the ingest's transaction; the per-device quota applied at once."""

    def __init__(self, engine: Any, *, quota_bytes: int = DEFAULT_QUOTA_BYTES) -> None:
        self.quota_bytes = quota_bytes
        self._insert = insert_ignoring_duplicates(engine, schema.captures)

    def write(self, db: Any, captures: list[Capture]) -> tuple[int, int]:
        """Store ``captures``; (stored, evicted for the quota). Duplicates are neither."""
        stored = 0
        devices = set()
        for capture in captures:
            upload = capture.upload
            row = {
                "device_id": upload.device_id,
                "model": upload.model,
                "name": upload.name,
                "size": upload.size,
                "sha256": upload.sha256,
                "received": time.time(),
                "data": capture.content,
            }
            if inserted_new_row(db, self._insert.values(**row), schema.captures.c.id):
                stored += 1
                devices.add(upload.device_id)
        return stored, sum(self._enforce_quota(db, device) for device in sorted(devices))

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
