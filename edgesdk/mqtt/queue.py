"""Store-and-forward: an SQLite (WAL) outbox for every message that must reach the fleet.

Every telemetry, event and OTA-status message is written here *before* it is published, sent
in row order, and deleted only after the broker's PUBACK. So a broker outage, an agent restart
or a power cut loses nothing that was enqueued; at worst a message acknowledged just before the
crash is sent again (at-least-once — payloads carry ``msg_id`` so the fleet can de-duplicate).

Durability (``durability="full"``, the default): the journal is WAL; an *enqueue* commits with
``synchronous=FULL`` (the WAL is fsync'd, so a power cut right after ``enqueue`` returns cannot
lose the message), while *acknowledgement deletes* commit with ``synchronous=NORMAL`` (no
fsync: a power cut can only undo a delete, which re-sends a duplicate the fleet drops by
``msg_id``). Enqueues are rare (one per telemetry interval) and deletes come in bursts during a
drain, so the costly fsync is paid only where losing data is at stake. ``durability="normal"``
skips the fsync on enqueue too: still safe against a killed process (SIGKILL), not against a
power cut; the benchmark's thousand simulated devices use it to share one disk.

Bounded by a disk quota (``max_bytes``, counted as topic + payload + a fixed per-row overhead):
when a new message does not fit, the *oldest* messages are dropped first — recent telemetry is
worth more than old — and the drops are counted persistently and reported in telemetry as
``dropped_messages``.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgesdk.errors import LinkError

log = logging.getLogger(__name__)

#: Bytes charged per row on top of topic and payload (row header, index entry, timestamps).
ROW_OVERHEAD_BYTES = 64

Durability = Literal["full", "normal"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class QueuedMessage:
    """One row of the outbox."""

    row_id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    created: float


def _row_size(topic: str, payload: bytes) -> int:
    return len(topic.encode()) + len(payload) + ROW_OVERHEAD_BYTES


class MessageQueue:
    """The SQLite outbox; thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path, *, max_bytes: int = 64 * 1024 * 1024, durability: Durability = "full") -> None:
        if max_bytes <= ROW_OVERHEAD_BYTES:
            raise LinkError(f"queue quota {max_bytes} bytes is too small (needs more than {ROW_OVERHEAD_BYTES})")
        if durability not in ("full", "normal"):
            raise LinkError(f"bad queue durability {durability!r}: use 'full' or 'normal'")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.durability = durability
        self._lock = threading.RLock()  # build() callbacks may read depth/dropped
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._synchronous = ""
        self._db = self._open()
        row = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(topic AS BLOB)) + LENGTH(payload)), 0) FROM outbox"
        ).fetchone()
        self._depth = int(row[0])
        self._bytes = int(row[1]) + self._depth * ROW_OVERHEAD_BYTES
        self._dropped = self._counter("dropped")
        self._last_row_id = int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM outbox").fetchone()[0])

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            # A queue file that SQLite cannot read must not stop the agent from reporting:
            # keep it for inspection and start an empty one.
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            log.error("store-and-forward queue %s is unreadable (%s); moved to %s", self.path, exc, aside)
            self.path.rename(aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LinkError(f"cannot put queue {self.path} in WAL mode (got {mode!r})")
        db.executescript(_SCHEMA)
        db.execute("PRAGMA quick_check").fetchone()
        return db

    # -- writing --------------------------------------------------------------------------------
    def enqueue(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> int:
        """Store one message durably; returns its row id (publication order)."""
        size = _row_size(topic, payload)
        with self._lock:
            if self._bytes + size <= self.max_bytes:
                # Common case, one statement (its own transaction): no counter, nothing to drop.
                self._set_synchronous("FULL" if self.durability == "full" else "NORMAL")
                cursor = self._db.execute(
                    "INSERT INTO outbox (topic, payload, qos, retain, created) VALUES (?, ?, ?, ?, ?)",
                    (topic, payload, qos, int(retain), time.time()),
                )
                if cursor.lastrowid is None:
                    raise LinkError(f"queue {self.path}: insert returned no row id")
                self._depth += 1
                self._bytes += size
                self._last_row_id = int(cursor.lastrowid)
                return self._last_row_id
        row_id, _ = self.enqueue_built(topic, lambda _seq: payload, qos=qos, retain=retain, counter=None)
        return row_id

    def enqueue_built(
        self,
        topic: str,
        build: Callable[[int], bytes],
        *,
        qos: int = 1,
        retain: bool = False,
        counter: str | None = "seq",
    ) -> tuple[int, int]:
        """Allocate the next value of a persistent ``counter`` and store ``build(value)`` in one commit.

        Telemetry sequence numbers come from here, so they never repeat after a restart.
        Returns ``(row_id, counter_value)``; with ``counter=None`` no counter is kept (value 0).
        """
        with self._lock:
            db = self._db
            self._set_synchronous("FULL" if self.durability == "full" else "NORMAL")
            db.execute("BEGIN IMMEDIATE")
            try:
                value = self._counter(counter) if counter is not None else 0
                payload = build(value)
                size = _row_size(topic, payload)
                if size > self.max_bytes:
                    raise LinkError(f"message of {size} bytes for {topic!r} exceeds the queue quota {self.max_bytes}")
                dropped = self._make_room(size)
                cursor = db.execute(
                    "INSERT INTO outbox (topic, payload, qos, retain, created) VALUES (?, ?, ?, ?, ?)",
                    (topic, payload, qos, int(retain), time.time()),
                )
                if counter is not None:
                    db.execute(
                        "INSERT INTO counters (name, value) VALUES (?, ?) "
                        "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                        (counter, value + 1),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            self._dropped += dropped[0]
            self._depth += 1 - dropped[0]
            self._bytes += size - dropped[1]
            row_id = cursor.lastrowid
            if row_id is None:
                raise LinkError(f"queue {self.path}: insert returned no row id")
            self._last_row_id = int(row_id)
            return self._last_row_id, value

    def _set_synchronous(self, mode: str) -> None:
        if self._synchronous != mode:
            self._db.execute(f"PRAGMA synchronous={mode}")
            self._synchronous = mode

    def _counter(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def _make_room(self, size: int) -> tuple[int, int]:
        """Drop the oldest rows until ``size`` more bytes fit; returns (rows, bytes) dropped."""
        if self._bytes + size <= self.max_bytes:
            return 0, 0
        need = self._bytes + size - self.max_bytes
        freed = rows = 0
        victims: list[int] = []
        for row_id, row_bytes in self._db.execute(
            "SELECT id, LENGTH(CAST(topic AS BLOB)) + LENGTH(payload) FROM outbox ORDER BY id"
        ):
            victims.append(int(row_id))
            freed += int(row_bytes) + ROW_OVERHEAD_BYTES
            rows += 1
            if freed >= need:
                break
        if victims:
            self._db.execute("DELETE FROM outbox WHERE id <= ?", (victims[-1],))
            self._db.execute(
                "INSERT INTO counters (name, value) VALUES ('dropped', ?) "
                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (rows,),
            )
            log.warning("store-and-forward quota %d bytes full: dropped the %d oldest message(s)", self.max_bytes, rows)
        return rows, freed

    def ack(self, row_ids: Iterable[int]) -> int:
        """Delete acknowledged rows; returns how many existed."""
        ids = [int(row_id) for row_id in row_ids]
        deleted = freed = 0
        with self._lock:
            self._set_synchronous("NORMAL")
            # One statement per 500 ids (its own transaction): a drain deletes in batches.
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"DELETE FROM outbox WHERE id IN ({marks}) RETURNING LENGTH(CAST(topic AS BLOB)) + LENGTH(payload)",
                    chunk,
                ).fetchall()
                deleted += len(rows)
                freed += sum(int(r[0]) for r in rows) + ROW_OVERHEAD_BYTES * len(rows)
            self._depth -= deleted
            self._bytes -= freed
        return deleted

    # -- reading --------------------------------------------------------------------------------
    def peek(self, after_id: int = 0, limit: int = 100) -> list[QueuedMessage]:
        """Up to ``limit`` messages with row id greater than ``after_id``, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, topic, payload, qos, retain, created FROM outbox WHERE id > ? ORDER BY id LIMIT ?",
                (after_id, limit),
            ).fetchall()
        return [QueuedMessage(int(r[0]), str(r[1]), bytes(r[2]), int(r[3]), bool(r[4]), float(r[5])) for r in rows]

    @property
    def last_row_id(self) -> int:
        """Row id of the newest message ever enqueued (0 when none): lets a reader skip empty reads."""
        return self._last_row_id

    @property
    def depth(self) -> int:
        """Messages waiting (not yet acknowledged)."""
        return self._depth

    @property
    def bytes_used(self) -> int:
        """Bytes charged against the quota."""
        return self._bytes

    @property
    def dropped(self) -> int:
        """Messages dropped by the quota since the queue was created (persistent)."""
        return self._dropped

    def close(self) -> None:
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            self._db.close()
