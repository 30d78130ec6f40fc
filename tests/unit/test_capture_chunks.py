"""Capture files in chunks (issue 41): the ingest on SQLite reassembles a file whose chunks come
out of order or twice, stores it once and acknowledges it to its device; it keeps nothing of a
chunk whose count, index or length does not fit the size it declares, refuses a file over the cap,
drops a file whose chunks do not make its SHA-256 and an upload left unfinished past its timeout,
and bounds the uploads open at once. The agent's uploader sends a large file chunk by chunk, goes
on after a restart from the chunk after the last one queued, and deletes a file only on an ack
naming it (not on a forged one)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")

from edgesdk.agent.capture.upload import CaptureUploader  # noqa: E402

from edgesdk.capture.upload import CHUNK_BYTES, CaptureAck, CaptureUpload, upload_message  # noqa: E402
from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.captures import list_captures, read_capture  # noqa: E402
from edgesdk.fleet.service.database import Transaction, migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402

TOPIC = "edgesdk/devices/dev-a/capture"
NAME = "20261206T000001.000000Z-000001-digits.edgecap"


def _chunks(content: bytes, name: str = NAME) -> list[CaptureUpload]:
    count = upload_message("dev-a", name, "digits", content).count
    return [upload_message("dev-a", name, "digits", content, index) for index in range(count)]


class _Service:
    """An ingest on SQLite whose acknowledgements to devices are recorded."""

    def __init__(self, root: Path, **options: Any) -> None:
        self.engine = open_engine(f"sqlite:///{root / 'fleet.sqlite3'}")
        migrate(self.engine)
        self.acks: list[tuple[str, CaptureAck]] = []
        publish = lambda topic, payload, qos: self.acks.append((topic, CaptureAck.model_validate_json(payload)))  # noqa: E731
        self.ingest = Ingest(self.engine, "edgesdk", SqlRolloutStore(self.engine), publish=publish, **options).start()

    def send(self, *messages: CaptureUpload) -> None:
        for message in messages:
            assert self.ingest.handle(TOPIC, message.model_dump_json().encode())
        assert self.ingest.drain(30)

    def stored(self) -> list[bytes]:
        return [read_capture(self.engine, e["id"])[1] for e in list_captures(self.engine, "dev-a")]  # type: ignore[index]

    def open_parts(self) -> int:
        with Transaction(self.engine) as db:
            return len(db.execute(schema.capture_parts.select()).all())

    def close(self) -> None:
        self.ingest.stop()
        self.engine.dispose()


@pytest.fixture
def service(tmp_path: Path) -> Any:
    made = _Service(tmp_path, capture_max_bytes=4 * CHUNK_BYTES)
    yield made
    made.close()


def test_chunks_out_of_order_and_twice_make_one_stored_file_acknowledged_to_its_device(service: Any) -> None:
    content = os.urandom(2 * CHUNK_BYTES + 1000)  # three chunks
    first, second, third = _chunks(content)
    service.send(third, first, third)
    assert service.stored() == [] and service.acks == []  # not whole yet: nothing acknowledged
    service.send(second, second)
    assert service.stored() == [content] and service.open_parts() == 0
    sha256 = hashlib.sha256(content).hexdigest()
    assert service.acks == [("edgesdk/devices/dev-a/capture/ack", CaptureAck(device_id="dev-a", sha256=sha256))]
    service.send(first)  # a chunk redelivered after the file was stored: acknowledged again, not stored
    assert service.stored() == [content] and len(service.acks) == 2
    counters = service.ingest.counters
    assert counters.capture_stored == 1 and counters.duplicates == 3, counters


def test_a_missing_chunk_stores_nothing_and_the_idle_upload_expires(service: Any) -> None:
    first, _, third = _chunks(os.urandom(2 * CHUNK_BYTES + 10))
    service.send(first, third)
    assert service.stored() == [] and service.open_parts() == 2 and service.acks == []
    with Transaction(service.engine) as db:
        store = service.ingest._captures
        assert store.expire(db, now=1e12) == 1  # idle past its timeout
    assert service.open_parts() == 0


def test_chunks_that_do_not_fit_their_declared_size_or_sha256_are_refused(service: Any) -> None:
    content = os.urandom(CHUNK_BYTES + 10)
    first, second = _chunks(content)
    huge_count = first.model_copy(update={"count": 10**9})
    bogus_index = second.model_copy(update={"index": 7})
    short = second.model_copy(update={"data": first.data})  # a full chunk where 10 bytes belong
    over_cap = upload_message("dev-a", NAME, "digits", b"y" * (4 * CHUNK_BYTES + 1))  # declares over the cap
    service.send(huge_count, bogus_index, short, over_cap)
    assert service.open_parts() == 0 and service.ingest.counters.malformed == 3
    assert service.ingest.counters.capture_refused == 1
    other = os.urandom(CHUNK_BYTES + 10)
    lying = [c.model_copy(update={"sha256": first.sha256}) for c in _chunks(other, "lying.edgecap")]
    service.send(*lying)  # well-formed chunks whose bytes are not the SHA-256 they declare
    assert service.stored() == [] and service.open_parts() == 0 and service.acks == []
    assert service.ingest.counters.capture_corrupt == 1
    service.send(first, second)  # the genuine file still arrives
    assert service.stored() == [content]


def test_uploads_open_at_once_are_bounded_per_device(tmp_path: Path) -> None:
    service = _Service(tmp_path, capture_max_bytes=4 * CHUNK_BYTES)
    service.ingest._captures.max_open_per_device = 2
    try:
        firsts = [_chunks(os.urandom(CHUNK_BYTES + 1), f"f{i}.edgecap")[0] for i in range(3)]
        service.send(*firsts)
        assert service.open_parts() == 2 and service.ingest.counters.capture_refused == 1
    finally:
        service.close()


class _Link:
    """The agent link's surface the uploader uses; the outbox empties at once."""

    def __init__(self) -> None:
        self.client = type("Client", (), {"connected": True})()
        self.queue = type("Outbox", (), {"depth": 0})()
        self.sent: list[CaptureUpload] = []
        self.handlers: dict[str, Any] = {}

    def subscribe(self, suffix: str, handler: Any) -> None:
        self.handlers[suffix] = handler

    def publish_reliable(self, suffix: str, message: CaptureUpload) -> int:
        assert suffix == "capture"
        self.sent.append(message)
        return len(self.sent)


def test_the_uploader_sends_chunks_resumes_after_a_restart_and_deletes_only_on_a_matching_ack(tmp_path: Path) -> None:
    content = os.urandom(2 * CHUNK_BYTES + 5)
    path = tmp_path / NAME
    path.write_bytes(content)
    link = _Link()
    uploader = CaptureUploader(tmp_path, "dev-a", lambda: link)
    assert uploader.send_next() and [m.index for m in link.sent] == [0]
    restarted = CaptureUploader(tmp_path, "dev-a", lambda: link)  # chunk 0 is in the durable outbox
    while restarted.send_next():
        pass
    assert [(m.index, m.count) for m in link.sent] == [(0, 3), (1, 3), (2, 3)]
    assert b"".join(m.chunk() for m in link.sent) == content
    sha256 = hashlib.sha256(content).hexdigest()
    on_ack = link.handlers["capture/ack"]
    for forged in (CaptureAck(device_id="dev-a", sha256="0" * 64), CaptureAck(device_id="dev-b", sha256=sha256)):
        on_ack(forged.model_dump_json().encode())
    on_ack(b"not json")
    assert path.exists() and restarted.counts.ignored_acks == 3
    on_ack(CaptureAck(device_id="dev-a", sha256=sha256).model_dump_json().encode())
    assert not path.exists() and restarted.counts.acknowledged == 1
    assert CaptureUploader(tmp_path, "dev-a", lambda: link)._read_ledger() == {}


def test_the_uploader_keeps_a_file_acknowledged_before_it_was_sent_in_full(tmp_path: Path) -> None:
    content = os.urandom(CHUNK_BYTES + 5)
    path = tmp_path / NAME
    path.write_bytes(content)
    link = _Link()
    uploader = CaptureUploader(tmp_path, "dev-a", lambda: link)
    assert uploader.send_next()  # chunk 0 of 2
    ack = CaptureAck(device_id="dev-a", sha256=hashlib.sha256(content).hexdigest())
    link.handlers["capture/ack"](ack.model_dump_json().encode())
    assert path.exists() and uploader.counts.ignored_acks == 1


def test_the_uploader_sends_again_a_file_not_acknowledged_in_time(tmp_path: Path) -> None:
    content = os.urandom(CHUNK_BYTES + 5)
    (tmp_path / NAME).write_bytes(content)
    link = _Link()
    uploader = CaptureUploader(tmp_path, "dev-a", lambda: link, resend_after_s=3600)
    while uploader.send_next():
        pass
    assert [m.index for m in link.sent] == [0, 1]  # sent in full, no ack yet: not again so soon
    uploader.resend_after_s = 0  # as if the hour had passed with no ack (the chunks reached no service)
    assert uploader.send_next() and [m.index for m in link.sent] == [0, 1, 0] and uploader.counts.resent == 1
