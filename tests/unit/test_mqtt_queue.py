"""The SQLite store-and-forward outbox: order, acknowledgement, quota, restart, SIGKILL."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgesdk.errors import LinkError
from edgesdk.mqtt.queue import ROW_OVERHEAD_BYTES, MessageQueue


def test_messages_come_back_in_order_and_leave_only_when_acknowledged(tmp_path: Path) -> None:
    queue = MessageQueue(tmp_path / "q.db")
    ids = [queue.enqueue("t", f"m{i}".encode()) for i in range(5)]
    assert ids == sorted(ids) and queue.depth == 5
    batch = queue.peek(0, 3)
    assert [m.payload for m in batch] == [b"m0", b"m1", b"m2"]
    assert [m.payload for m in queue.peek(batch[-1].row_id, 10)] == [b"m3", b"m4"]
    assert queue.ack([ids[1], ids[0]]) == 2
    assert queue.ack([ids[0]]) == 0  # a duplicate PUBACK deletes nothing
    assert [m.payload for m in queue.peek()] == [b"m2", b"m3", b"m4"] and queue.depth == 3


def test_the_queue_is_in_wal_mode(tmp_path: Path) -> None:
    MessageQueue(tmp_path / "q.db").close()
    with sqlite3.connect(tmp_path / "q.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unacknowledged_messages_and_counters_survive_reopening(tmp_path: Path) -> None:
    queue = MessageQueue(tmp_path / "q.db")
    for _ in range(3):
        queue.enqueue_built("t", lambda seq: f"seq={seq}".encode(), counter="telemetry_seq")
    queue.ack([queue.peek()[0].row_id])
    queue.close()
    reopened = MessageQueue(tmp_path / "q.db")
    assert [m.payload for m in reopened.peek()] == [b"seq=1", b"seq=2"]
    assert reopened.depth == 2
    _, seq = reopened.enqueue_built("t", lambda seq: b"x", counter="telemetry_seq")
    assert seq == 3  # sequence numbers never repeat after a restart


def test_quota_drops_the_oldest_first_and_counts_persistently(tmp_path: Path) -> None:
    payload = b"x" * 100
    row = len(b"t") + len(payload) + ROW_OVERHEAD_BYTES
    queue = MessageQueue(tmp_path / "q.db", max_bytes=row * 10)
    for i in range(15):
        queue.enqueue("t", payload[:-3] + f"{i:03d}".encode())
    assert queue.depth == 10 and queue.bytes_used <= queue.max_bytes
    assert queue.dropped == 5
    assert [m.payload[-3:] for m in queue.peek(0, 100)] == [f"{i:03d}".encode() for i in range(5, 15)]
    queue.close()
    assert MessageQueue(tmp_path / "q.db", max_bytes=row * 10).dropped == 5


def test_a_message_larger_than_the_quota_is_refused_clearly(tmp_path: Path) -> None:
    queue = MessageQueue(tmp_path / "q.db", max_bytes=1000)
    with pytest.raises(LinkError, match="exceeds the queue quota 1000"):
        queue.enqueue("t", b"x" * 2000)
    assert queue.depth == 0


def test_an_unreadable_queue_file_is_moved_aside_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(b"this is not an sqlite database" * 100)
    queue = MessageQueue(path)
    queue.enqueue("t", b"fresh")
    assert queue.depth == 1
    assert list(tmp_path.glob("q.db.corrupt-*"))


def test_enqueued_messages_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    child = textwrap.dedent(
        f"""
        import os, signal, sys
        from pathlib import Path
        from edgesdk.mqtt.queue import MessageQueue
        q = MessageQueue(Path({str(path)!r}))
        for i in range(200):
            q.enqueue("t", str(i).encode())
        q.ack([m.row_id for m in q.peek(0, 50)])
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.strip() == "ready"
    queue = MessageQueue(path)
    assert [int(m.payload) for m in queue.peek(0, 1000)] == list(range(50, 200))
    assert os.path.exists(path)
