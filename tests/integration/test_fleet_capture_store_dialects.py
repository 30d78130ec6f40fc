"""Capture uploads through the ingest on SQLite and on a throwaway PostgreSQL cluster (issue 41):
a device's captures beyond its quota push out its oldest (counted), a redelivered upload is stored
once, an upload over the size cap is refused (counted), one on another device's topic is dropped
(``impersonating``), and the list and the download give back what was stored, byte for byte, on
both databases alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")

from edgesdk.capture.upload import upload_message  # noqa: E402
from edgesdk.fleet.service.captures import list_captures, read_capture  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest, read_counters  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402
from tests.pg_helpers import throwaway_cluster  # noqa: E402

pytestmark = pytest.mark.integration

TOPIC = "edgesdk/devices/{}/capture"


def _upload(device: str, second: int, content: bytes) -> bytes:
    name = f"20261205T0000{second:02d}.000000Z-{second:06d}-digits.edgecap"
    return upload_message(device, name, "digits", content).model_dump_json().encode()


def _store(url: str) -> tuple[list[dict[str, Any]], list[bytes], dict[str, int]]:
    engine = open_engine(url)
    migrate(engine)
    ingest = Ingest(engine, "edgesdk", SqlRolloutStore(engine), capture_quota_bytes=25, capture_max_bytes=12)
    ingest.start()
    for second in range(1, 5):  # four files of 10 bytes, 25 allowed: the oldest two go
        payload = _upload("dev-a", second, bytes([second]) * 10)
        assert ingest.handle(TOPIC.format("dev-a"), payload)
        assert ingest.drain(30)
    assert ingest.handle(TOPIC.format("dev-a"), payload)  # the newest again: a redelivery
    assert ingest.handle(TOPIC.format("dev-a"), _upload("dev-a", 9, b"x" * 13))  # over the 12-byte cap
    assert ingest.handle(TOPIC.format("dev-a"), _upload("dev-b", 8, b"as dev-b"))  # on dev-a's topic
    assert ingest.drain(30)
    ingest.stop()
    listed = list_captures(engine, "dev-a")
    contents = [read_capture(engine, entry["id"])[1] for entry in listed]  # type: ignore[index]
    counters = read_counters(engine, "test")
    assert list_captures(engine, "dev-b") == [] and read_capture(engine, 10**9) is None
    engine.dispose()
    return listed, contents, counters


@pytest.fixture(scope="module")
def postgres() -> Any:
    with throwaway_cluster() as cluster:
        yield cluster


def test_capture_quota_cap_and_redelivery_hold_on_sqlite_and_postgresql(postgres: Any, tmp_path: Path) -> None:
    for url in (f"sqlite:///{tmp_path / 'fleet.sqlite3'}", postgres.create_database("fleet_captures")):
        listed, contents, counters = _store(url)
        assert [entry["name"][:16] for entry in listed] == ["20261205T000004.", "20261205T000003."], url
        assert contents == [bytes([4]) * 10, bytes([3]) * 10], url
        assert all(entry["model"] == "digits" and entry["size"] == 10 for entry in listed)
        assert counters["capture_stored"] == 4 and counters["capture_evicted"] == 2, counters
        assert counters["capture_refused"] == 1 and counters["impersonating"] == 1, counters
        assert counters["duplicates"] == 1, counters
