"""A device's OTA history on the dashboard shows a state reported twice for one deployment once,
with the count (issue 40: ROLLED_BACK appeared twice after an abort and a rollback)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
pytest.importorskip("fastapi", reason="the fleet service API needs fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from edgesdk.fleet.service import tokens  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest  # noqa: E402
from edgesdk.fleet.service.rest.app import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402


def test_a_repeated_ota_state_shows_once_in_the_device_history(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'history.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    ingest = Ingest(engine, "edgesdk", store).start()
    start = datetime.now(timezone.utc)
    presence = {"device_id": "dev-1", "online": True, "ts": start.isoformat(), "groups": ["line-1"]}
    ingest.handle("edgesdk/devices/dev-1/presence", json.dumps(presence).encode())
    for i, state in enumerate(["COMMITTED", "ROLLED_BACK", "ROLLED_BACK"]):
        ts = (start + timedelta(seconds=i + 1)).isoformat()
        status = {"device_id": "dev-1", "deployment_id": "d1", "msg_id": f"m{i}", "ts": ts, "state": state}
        ingest.handle("edgesdk/devices/dev-1/ota/status", json.dumps(status).encode())
    assert ingest.drain(10)
    ingest.stop()
    context = ApiContext(engine=engine, store=store, commands=None, data_dir=tmp_path)  # type: ignore[arg-type]
    secret = tokens.create_token(engine, name="viewer", role="viewer", created_by="test")[1]
    with TestClient(create_app(context)) as client:
        login = client.get("/login").text
        csrf = re.search(r'name=csrf value="([^"]+)"', login)
        assert csrf, login
        client.post("/login", data={"token": secret, "csrf": csrf.group(1)})
        page = client.get("/ui/devices/dev-1").text
    table = re.search(r"<table id=ota[^>]*>(.*?)</table>", page, re.S)
    assert table, page
    assert table.group(1).count(">ROLLED_BACK<") == 1, table.group(1)
    assert table.group(1).count(">COMMITTED<") == 1
    assert "(reported 2×)" in table.group(1)
    engine.dispose()
