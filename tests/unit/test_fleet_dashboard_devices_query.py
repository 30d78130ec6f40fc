"""The devices page's query (``dashboard_devices.find_devices``) on a real SQLite database:
each filter, the tag search, sort and pages done by the database."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")

from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.dashboard_devices import BadQuery, DeviceQuery, find_devices  # noqa: E402
from edgesdk.fleet.service.database import Transaction, migrate, open_engine  # noqa: E402


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'devices.sqlite3'}"
    engine = open_engine(url)
    migrate(engine)
    now = time.time()
    with Transaction(engine) as db:
        for i in range(30):
            db.execute(
                schema.devices.insert().values(
                    device_id=f"d-{i:02d}",
                    online=i % 5 != 0,
                    groups=json.dumps(["line-b" if i % 2 else "line-a"]),
                    profile="rpi5-8gb" if i % 3 else "pi-zero-2w",
                    model_version="1.2.0" if i < 10 else "1.3.0",
                    first_seen=now,
                    last_seen=now - i,
                )
            )
        db.execute(schema.device_tags.insert().values(device_id="d-07", key="site", value="lab-3", updated=now))
    return engine


def ids(rows: list[Any]) -> list[str]:
    return [r.device_id for r in rows]


def test_the_device_query_filters_each_field_and_searches_tags(engine: Any) -> None:
    query = DeviceQuery(group="line-b", state="offline", profile="rpi5-8gb")
    total, rows, _latest = find_devices(engine, query)
    assert (total, ids(rows)) == (2, ["d-05", "d-25"])
    assert ids(find_devices(engine, DeviceQuery(q="site=lab"))[1]) == ["d-07"]
    assert find_devices(engine, DeviceQuery(version="1.2.0"))[0] == 10


def test_the_device_query_sorts_and_pages_in_the_database(engine: Any) -> None:
    total, rows, _ = find_devices(engine, DeviceQuery(sort="seen", desc=True, page=2, per_page=7))
    assert total == 30  # newest seen first: d-00 .. d-06 on page 1
    assert ids(rows) == [f"d-{i:02d}" for i in range(7, 14)]


def test_a_bad_device_query_names_the_value_and_what_is_allowed() -> None:
    with pytest.raises(BadQuery, match="state 'banana' is not one of online, offline, unknown"):
        DeviceQuery.parse({"state": "banana"})
    with pytest.raises(BadQuery, match="per_page 1000 is over 200"):
        DeviceQuery.parse({"per_page": "1000"})
