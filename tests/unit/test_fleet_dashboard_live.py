"""The dashboard's live stream pieces: the change events between two snapshots, one snapshot a
poll shared by every stream, and the per-session bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")

from edgesdk.fleet.service import dashboard_live  # noqa: E402
from edgesdk.fleet.service.dashboard_live import SharedSnapshot, StreamLimit, changes  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402


def test_live_changes_name_what_changed_and_what_is_gone() -> None:
    before = {"device": {"a": {"presence": "online"}, "b": {"presence": "online"}}}
    after = {"device": {"a": {"presence": "offline"}, "c": {"presence": "online"}}}
    messages = changes(before, after)
    parsed = [(m.split("\n")[0], json.loads(m.split("\n")[1].removeprefix("data: "))) for m in messages]
    assert sorted(parsed, key=str) == sorted(
        [
            ("event: device", {"gone": True, "id": "b"}),
            ("event: device", {"presence": "offline"}),
            ("event: device", {"presence": "online"}),
        ],
        key=str,
    )
    assert changes(after, after) == []


def test_one_live_snapshot_a_poll_serves_every_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'live.sqlite3'}")
    migrate(engine)
    taken: list[int] = []
    real = dashboard_live.snapshot
    monkeypatch.setattr(dashboard_live, "snapshot", lambda e, b: taken.append(1) or real(e, b))
    shared = SharedSnapshot(engine, max_age_s=60)
    first = shared.get(None)
    assert all(shared.get(None) is first for _ in range(5)) and len(taken) == 1
    assert first["enrollment"] == {} and first["broker"] == {"broker": {"known": True}}
    engine.dispose()


def test_live_streams_are_bounded_per_session() -> None:
    limit = StreamLimit(limit=2)
    assert limit.acquire("s1") and limit.acquire("s1") and not limit.acquire("s1")
    assert limit.acquire("s2")  # another session has its own bound
    limit.release("s1")
    assert limit.acquire("s1")
