"""The fleet service's REST API in-process (FastAPI's TestClient, SQLite, a stand-in for the
rollout controller): tokens and roles, refused writes audited, 404s, validation, OpenAPI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
pytest.importorskip("fastapi", reason="the fleet service API needs fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from edgesdk.fleet.deployments import ABORTED, ROLLED_BACK  # noqa: E402
from edgesdk.fleet.service import audit, tokens  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.rest.app import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402
from tests.unit.test_fleet_service_store import _telemetry, _template  # noqa: E402


class Commands:
    """Stands in for the rollout controller: records, and stores the state it would."""

    def __init__(self, store: SqlRolloutStore) -> None:
        self.store = store
        self.calls: list[tuple[str, str, str]] = []

    def abort(self, deployment_id: str, reason: str = "", *, ttl_s: float | None = None) -> None:
        self.calls.append(("abort", deployment_id, reason))
        self.store.set_state(deployment_id, ABORTED, reason=reason)

    def rollback(self, deployment_id: str, reason: str = "", *, ttl_s: float | None = None) -> int:
        self.calls.append(("rollback", deployment_id, reason))
        self.store.set_state(deployment_id, ROLLED_BACK, reason=reason)
        return 3


@pytest.fixture
def api(tmp_path: Path):
    engine = open_engine(f"sqlite:///{tmp_path / 'api.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    commands = Commands(store)
    app = create_app(ApiContext(engine=engine, store=store, commands=commands, data_dir=tmp_path))
    keys = {
        role: tokens.create_token(engine, name=f"{role}-person", role=role, created_by="test")[1]
        for role in tokens.ROLES
    }
    with TestClient(app) as client:
        yield client, keys, engine, store, commands
    engine.dispose()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_reads_need_a_token_and_writes_a_role_and_every_write_is_audited(api, tmp_path: Path) -> None:
    client, keys, engine, store, commands = api
    bundle = tmp_path / "b.edgepkg"
    bundle.write_bytes(b"x")
    store.create(_template("dep-1"), bundle, {"canary": 0.1, "command_ttl_s": 60}, [["a"], ["b", "c"]])

    assert client.get("/api/v1/devices").status_code == 401
    assert client.get("/api/v1/devices", headers=_auth("esf_nope_nope")).status_code == 401
    assert client.get("/api/v1/devices", headers=_auth(keys["viewer"])).json() == {
        "items": [],
        "total": 0,
        "limit": 100,
        "offset": 0,
    }
    # Writes without a token, and with a viewer's.
    assert client.post("/api/v1/deployments/dep-1/abort").status_code == 401
    refused = client.post("/api/v1/deployments/dep-1/abort", headers=_auth(keys["viewer"]))
    assert refused.status_code == 403 and "operator role" in refused.json()["detail"]
    assert client.post("/api/v1/bundles", content=b"x", headers=_auth(keys["viewer"])).status_code == 403
    assert client.post("/api/v1/enrollment/a/revoke", headers=_auth(keys["operator"])).status_code == 403
    assert (
        client.post("/api/v1/tokens", json={"name": "x", "role": "admin"}, headers=_auth(keys["operator"])).status_code
        == 403
    )
    assert commands.calls == [] and store.get("dep-1").state == "PENDING"

    done = client.post("/api/v1/deployments/dep-1/abort", json={"reason": "bad build"}, headers=_auth(keys["operator"]))
    assert done.status_code == 200 and done.json()["state"] == ABORTED
    assert commands.calls == [("abort", "dep-1", "bad build")]
    again = client.post("/api/v1/deployments/dep-1/abort", headers=_auth(keys["operator"]))
    assert again.status_code == 409
    back = client.post("/api/v1/deployments/dep-1/rollback", headers=_auth(keys["operator"]))
    assert back.status_code == 200 and back.json()["asked"] == 3
    assert commands.calls[-1] == ("rollback", "dep-1", "rollback by operator-person")

    log = audit.entries(engine)
    outcomes = [(e["actor"].split(" ")[0], e["action"], e["outcome"]) for e in reversed(log)]
    assert outcomes == [
        ("anonymous", "deployment.abort", "refused"),
        ("viewer-person", "deployment.abort", "refused"),
        ("viewer-person", "bundle.upload", "refused"),
        ("operator-person", "enrollment.revoke", "refused"),
        ("operator-person", "token.create", "refused"),
        ("operator-person", "deployment.abort", "ok"),
        ("operator-person", "deployment.abort", "refused"),  # the 409: it already ended
        ("operator-person", "deployment.rollback", "ok"),
    ]
    assert client.get("/api/v1/audit", headers=_auth(keys["operator"])).status_code == 403
    assert client.get("/api/v1/audit", headers=_auth(keys["admin"])).json()["total"] == len(log)


def test_lookups_filters_validation_and_the_openapi_document(api) -> None:
    client, keys, engine, store, _ = api
    viewer, operator = _auth(keys["viewer"]), _auth(keys["operator"])
    assert client.get("/api/v1/devices/ghost", headers=viewer).status_code == 404
    assert client.get("/api/v1/deployments/ghost", headers=viewer).status_code == 404
    assert client.post("/api/v1/deployments/ghost/abort", headers=operator).status_code == 404
    missing = client.post("/api/v1/deployments", json={"bundle_id": "nope", "devices": ["a"]}, headers=operator)
    assert missing.status_code == 404 and "'nope'" in missing.json()["detail"]
    both = client.post("/api/v1/deployments", json={"bundle_id": "x", "devices": ["a"], "group": "g"}, headers=operator)
    assert both.status_code == 422
    falling = client.post(
        "/api/v1/deployments", json={"bundle_id": "x", "devices": ["a"], "waves": [0.5, 0.2]}, headers=operator
    )
    assert falling.status_code == 422
    unknown = client.post(
        "/api/v1/deployments", json={"bundle_id": "x", "devices": ["a"], "colour": 1}, headers=operator
    )
    assert unknown.status_code == 422
    garbage = client.post("/api/v1/bundles?filename=x.edgepkg", content=b"not a bundle", headers=operator)
    assert garbage.status_code == 400 and "x.edgepkg" in garbage.json()["detail"]

    from edgesdk.fleet.service.ingest import Ingest

    ingest = Ingest(engine, "edgesdk", store).start()
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    for device in ("dev-1", "dev-2"):
        ingest.handle(f"edgesdk/devices/{device}/telemetry", _telemetry(device, 1, now, 2.0))
    presence = {"device_id": "dev-1", "online": True, "ts": now.isoformat(), "groups": ["line-1"]}
    ingest.handle("edgesdk/devices/dev-1/presence", json.dumps(presence).encode())
    assert ingest.drain(10)
    ingest.stop()
    everyone = client.get("/api/v1/devices", headers=viewer).json()
    assert [d["device_id"] for d in everyone["items"]] == ["dev-1", "dev-2"]
    assert [d["device_id"] for d in client.get("/api/v1/devices?group=line-1", headers=viewer).json()["items"]] == [
        "dev-1"
    ]
    assert client.get("/api/v1/devices?state=online", headers=viewer).json()["total"] == 1
    assert client.get("/api/v1/devices?version=9.9.9", headers=viewer).json()["total"] == 0
    one = client.get("/api/v1/devices/dev-1", headers=viewer).json()
    assert one["latest"]["p95_ms"] == 2.0 and one["model_version"] == "1.0.0"
    history = client.get("/api/v1/devices/dev-1/history?hours=1", headers=viewer).json()
    assert history["resolution"] == "raw" and len(history["telemetry"]) == 1

    document = client.get("/openapi.json").json()
    assert {
        "/api/v1/devices",
        "/api/v1/deployments",
        "/api/v1/deployments/{deployment_id}/rollback",
        "/api/v1/bundles",
    } <= set(document["paths"])
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert client.get("/docs").status_code == 404  # the docs page would load scripts from a CDN


def _sign_in(client, token: str, **kw):  # type: ignore[no-untyped-def]
    """The sign-in form as a browser posts it: the CSRF field of GET /login with its cookie."""
    import re

    page = client.get("/login").text
    csrf = re.search(r'name=csrf value="([^"]+)"', page)
    assert csrf, page
    return client.post("/login", data={"token": token, "csrf": csrf.group(1)}, **kw)


def test_dashboard_pages_sign_in_and_refuse_viewer_and_forged_writes(api, tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from edgesdk.fleet.service.dashboard import COOKIE, csrf_for
    from edgesdk.fleet.service.ingest import Ingest

    client, keys, engine, store, commands = api
    bundle = tmp_path / "b.edgepkg"
    bundle.write_bytes(b"x")
    store.create(_template("dep-ui"), bundle, {"canary": 0.3, "waves": [1.0]}, [["dev-1"], ["dev-2"]])
    ingest = Ingest(engine, "edgesdk", store).start()
    ingest.handle("edgesdk/devices/dev-1/telemetry", _telemetry("dev-1", 1, datetime.now(timezone.utc), 2.0))
    assert ingest.drain(10)
    ingest.stop()

    assert client.get("/", follow_redirects=False).headers["location"] == "/login"
    wrong = _sign_in(client, "esf_x_y", follow_redirects=False)
    assert "unknown" in wrong.headers["location"]
    viewer = _sign_in(client, keys["viewer"], follow_redirects=False)
    assert viewer.status_code == 303 and COOKIE in viewer.cookies
    page = client.get("/").text
    assert 'id="device-dev-1"' in page and "dep-ui" in page and "start-rollout" not in page
    device = client.get("/ui/devices/dev-1").text
    assert "<svg" in device and "latency" in device and "a" * 64 in device  # the model hash
    rollout = client.get("/ui/deployments/dep-ui").text
    assert "canary" in rollout and 'id="abort"' not in rollout  # a viewer gets no buttons
    refused = client.post(
        "/ui/deployments/dep-ui/abort", data={"csrf": csrf_for(client.cookies[COOKIE])}, follow_redirects=False
    )
    assert "operator%20role" in refused.headers["location"] and commands.calls == []

    client.cookies.clear()
    assert _sign_in(client, keys["operator"]).status_code == 200
    rollout = client.get("/ui/deployments/dep-ui").text
    assert 'id="abort"' in rollout and 'id="rollback"' in rollout
    forged = client.post("/ui/deployments/dep-ui/abort", data={"csrf": "0" * 32}, follow_redirects=False)
    assert "stale" in forged.headers["location"] and commands.calls == []
    done = client.post(
        "/ui/deployments/dep-ui/abort", data={"csrf": csrf_for(client.cookies[COOKIE])}, follow_redirects=False
    )
    assert done.status_code == 303 and commands.calls == [("abort", "dep-ui", "abort by operator-person (dashboard)")]
    actions = [(e["actor"].split(" ")[0], e["action"], e["outcome"]) for e in audit.entries(engine)][:5]
    assert actions == [
        ("operator-person", "deployment.abort", "ok"),
        ("operator-person", "deployment.abort", "refused"),  # the forged form
        ("operator-person", "dashboard.login", "ok"),
        ("viewer-person", "deployment.abort", "refused"),
        ("viewer-person", "dashboard.login", "ok"),
    ]
    assert "no-model" not in client.get("/").text and "cdn" not in client.get("/").text.lower()


def test_every_route_in_the_tables_enforces_the_role_and_names_the_action_it_declares(api) -> None:
    """The route tables are the API's one declaration: every operator route the app serves is
    in a table; each refuses a request without a token (401) and, where it needs more than a
    viewer, a token of the role below (403, naming the table's action and role)."""
    from edgesdk.fleet.service.rest.app import ROUTE_TABLES

    client, keys, _engine, _store, _commands = api
    declared = {(route.method, route.path): route for table in ROUTE_TABLES for route in table.routes}
    served = {
        (method, route.path)
        for route in client.app.routes
        if route.path.startswith(("/api/", "/metrics", "/healthz", "/artifacts/"))
        for method in route.methods
    }
    assert served == set(declared)
    below = {"operator": "viewer", "admin": "operator"}
    for (method, path), route in declared.items():
        if route.role is None:
            continue
        url = path.replace("{", "").replace("}", "")  # each path parameter filled with its own name
        assert client.request(method, url).status_code == 401, (method, path)
        if route.role in below:
            refused = client.request(method, url, headers=_auth(keys[below[route.role]]))
            assert refused.status_code == 403, (method, path, refused.text)
            assert refused.json()["detail"].startswith(f"{route.action} needs the {route.role} role"), (method, path)
