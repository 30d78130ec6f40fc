"""The ingest holds at most ``CAPTURES_IN_FLIGHT`` capture files for its writer: one more waits on
the network thread (back-pressure, the broker keeps the rest) instead of growing the service's
memory, and goes on as soon as the writer has stored the ones before it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")

from edgesdk.capture.upload import upload_message  # noqa: E402
from edgesdk.fleet.service import ingest as ingest_module  # noqa: E402
from edgesdk.fleet.service.captures import list_captures  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402


def _upload(second: int) -> bytes:
    name = f"20261205T0000{second:02d}.000000Z-{second:06d}-digits.edgecap"
    return upload_message("dev-a", name, "digits", bytes([second]) * 10).model_dump_json().encode()


def test_capture_uploads_beyond_those_in_flight_wait_for_the_writer(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ingest_module, "CAPTURES_IN_FLIGHT", 2, raising=False)
    engine = open_engine(f"sqlite:///{tmp_path / 'fleet.sqlite3'}")
    migrate(engine)
    ingest = Ingest(engine, "edgesdk", SqlRolloutStore(engine))  # the writer not started yet
    topic = "edgesdk/devices/dev-a/capture"
    assert ingest.handle(topic, _upload(1)) and ingest.handle(topic, _upload(2))
    third = threading.Thread(target=ingest.handle, args=(topic, _upload(3)), daemon=True)
    third.start()
    time.sleep(0.3)
    assert third.is_alive()  # waits for a slot: the network thread slows the broker down
    ingest.start()
    third.join(10)
    assert not third.is_alive() and ingest.drain(10)
    ingest.stop()
    assert len(list_captures(engine, "dev-a")) == 3
    engine.dispose()
