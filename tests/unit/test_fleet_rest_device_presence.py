"""The REST device JSON says what the dashboard says about presence (issue 40): ``online`` is
null, not false, while the service has lost its broker or re-learns presence after it."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
pytest.importorskip("fastapi", reason="the fleet service API needs fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from edgesdk.fleet.service import tokens  # noqa: E402
from edgesdk.fleet.service.broker_watch import BrokerWatch  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest  # noqa: E402
from edgesdk.fleet.service.rest.app import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402


def test_rest_device_online_is_null_while_presence_is_unknown(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'presence.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    ingest = Ingest(engine, "edgesdk", store).start()
    now = datetime.now(timezone.utc).isoformat()
    for device_id, online in (("up-1", True), ("down-1", False)):
        presence = {"device_id": device_id, "online": True, "ts": now, "groups": ["line-1"]}
        ingest.handle(f"edgesdk/devices/{device_id}/presence", json.dumps(presence).encode())
        ingest.handle(f"edgesdk/devices/{device_id}/presence", json.dumps(presence | {"online": online}).encode())
    assert ingest.drain(10)
    ingest.stop()
    watch = BrokerWatch("mqtt://b:1883", relearn_s=30.0)
    context = ApiContext(engine=engine, store=store, commands=None, data_dir=tmp_path, broker_status=watch.status)  # type: ignore[arg-type]
    secret = tokens.create_token(engine, name="viewer", role="viewer", created_by="test")[1]
    headers = {"Authorization": f"Bearer {secret}"}

    def online() -> dict[str, object]:
        listed = {d["device_id"]: d["online"] for d in client.get("/api/v1/devices", headers=headers).json()["items"]}
        assert client.get("/api/v1/devices/down-1", headers=headers).json()["online"] == listed["down-1"]
        return listed

    with TestClient(create_app(context)) as client:
        watch.connected()
        assert online() == {"up-1": True, "down-1": False}
        watch.lost("connection lost")
        assert online() == {"up-1": None, "down-1": None}  # nobody knows: not "offline"
        watch.connected()  # back, re-learning: a stored online is trusted, a stored offline is not yet
        assert online() == {"up-1": True, "down-1": None}
    engine.dispose()
