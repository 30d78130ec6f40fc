"""The dashboard's rollout page after an abort (issue 40): devices of a wave never sent say
"NOT SENT" and why, not "PENDING" as if they were waiting; "Roll back" is offered only when the
rollout reached a device (there is nothing to undo otherwise)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
pytest.importorskip("fastapi", reason="the fleet service API needs fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from edgesdk.fleet.deployments import ABORTED  # noqa: E402
from edgesdk.fleet.service import tokens  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.rest.app import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402
from tests.unit.test_fleet_service_store import _template  # noqa: E402


def test_an_aborted_rollout_page_says_not_sent_and_offers_roll_back_only_when_something_was_reached(
    tmp_path: Path,
) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'page.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    bundle = tmp_path / "b.edgepkg"
    bundle.write_bytes(b"x")
    for name in ("dep-reached", "dep-unsent"):
        store.create(_template(name), bundle, {"canary": 0.5, "waves": [1.0]}, [["dev-1"], ["dev-2"]])
    store.set_device_state("dep-reached", "dev-1", "FAILED", "p95 over the SLO")
    for name in ("dep-reached", "dep-unsent"):
        store.set_state(name, ABORTED, reason="canary failed")
    secret = tokens.create_token(engine, name="op", role="operator", created_by="test")[1]
    context = ApiContext(engine=engine, store=store, commands=None, data_dir=tmp_path)  # type: ignore[arg-type]
    with TestClient(create_app(context)) as client:
        csrf = re.search(r'name=csrf value="([^"]+)"', client.get("/login").text)
        assert csrf
        client.post("/login", data={"token": secret, "csrf": csrf.group(1)})
        reached = client.get("/ui/deployments/dep-reached").text
        row = re.search(r'<tr id="dd-dev-2">.*?</tr>', reached)
        assert row and "NOT SENT" in row.group(0) and "PENDING" not in row.group(0), reached
        assert "aborted before this wave" in row.group(0)
        assert 'id="rollback"' in reached  # dev-1 was reached: there is something to roll back
        unsent = client.get("/ui/deployments/dep-unsent").text
        assert 'id="rollback"' not in unsent and 'id="abort"' not in unsent
    engine.dispose()
