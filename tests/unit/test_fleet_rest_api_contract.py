"""The fleet REST API's contract (issue 40, "a complete, consistent API"), through the real app
(FastAPI's TestClient, SQLite, a real uploaded bundle, telemetry through the real ingest):

* one error shape, RFC 9457 problem+json, for 401 (missing, unknown and revoked tokens each say
  so), 404, 409, 422 (``errors`` naming the field and the bad value) and 500 (no internals);
* enum filters are refused with the allowed values; conflicts are 409; a rollout to a device
  the service never saw is a 422 naming it; no answer shows a server path;
* the OpenAPI document: real path parameter names, a typed body for every answer, the errors
  documented as problem+json;
* every list is a page with a total; single bundle GET; DELETE of bundles (409 in use), tokens
  (revocation) and devices (decommission: broker password line and enrollment revoked);
  groups and alerts; ``latest`` in the device list; ``/healthz`` from the broker state;
* every refused write is in the audit log with its status.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
pytest.importorskip("fastapi", reason="the fleet service API needs fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from edgesdk.fleet.service import audit, tokens  # noqa: E402
from edgesdk.fleet.service.broker_watch import BrokerStatus  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest  # noqa: E402
from edgesdk.fleet.service.rest.app import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402
from tests.bundle_helpers import make_keys, placeholder_bundle  # noqa: E402
from tests.unit.test_fleet_service_store import _telemetry  # noqa: E402

PROBLEM = "application/problem+json"


class FailingCommands:
    """A rollout controller that breaks (for the 500 answer)."""

    def abort(self, deployment_id: str, reason: str = "", *, ttl_s: float | None = None) -> None:
        raise RuntimeError("secret internals: /var/lib/edgesdk/fleet.sqlite3")

    def rollback(self, deployment_id: str, reason: str = "", *, ttl_s: float | None = None) -> int:
        raise RuntimeError("secret internals")


@dataclass
class Api:
    client: TestClient
    keys: dict[str, str]
    engine: Any
    bundle_id: str
    broker: dict[str, Any]
    root: Path

    def as_(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("rest-contract")
    engine = open_engine(f"sqlite:///{root / 'api.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    since = datetime(2026, 1, 1, tzinfo=timezone.utc)
    broker = {"now": BrokerStatus(connected=True, since=since, disconnects=0)}
    (root / "passwords").write_text("dev-1:$7$101$c2FsdA==$aGFzaA==\ndev-2:$7$101$c2FsdA==$aGFzaA==\n")
    context = ApiContext(
        engine=engine,
        store=store,
        commands=FailingCommands(),
        data_dir=root,
        registry_path=root / "enrollment.json",
        device_passwords=root / "passwords",
        broker_status=lambda: broker["now"],
    )
    app = create_app(context)
    keys = {role: tokens.create_token(engine, name=f"{role}-p", role=role, created_by="t")[1] for role in tokens.ROLES}
    ingest = Ingest(engine, "edgesdk", store).start()
    now = datetime.now(timezone.utc)
    for number, device in enumerate(("dev-1", "dev-2", "dev-3")):
        ingest.handle(f"edgesdk/devices/{device}/telemetry", _telemetry(device, 1, now, 2.0 + number))
        presence = {"device_id": device, "online": True, "ts": now.isoformat(), "groups": ["line-1", f"g{number % 2}"]}
        ingest.handle(f"edgesdk/devices/{device}/presence", json.dumps(presence).encode())
    assert ingest.drain(10)
    ingest.stop()
    with TestClient(app, raise_server_exceptions=False) as client:
        bundle = placeholder_bundle(root, make_keys(root / "keys"))
        uploaded = client.post(
            "/api/v1/bundles?filename=digits.edgepkg", content=bundle.read_bytes(), headers=_auth(keys["operator"])
        )
        assert uploaded.status_code == 201, uploaded.text
        yield Api(client, keys, engine, uploaded.json()["id"], broker, root)
    engine.dispose()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _is_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = response.json()
    assert {"type", "title", "status", "detail", "instance"} <= set(body), body
    assert body["status"] == status and isinstance(body["detail"], str) and body["detail"]
    return body


def _rollout(api: Api, **fields: Any) -> dict[str, Any]:
    return {"bundle_id": api.bundle_id, "devices": ["dev-1"], "canary": 0, "waves": [1.0], **fields}


def test_a_missing_an_unknown_and_a_revoked_token_each_get_their_own_problem(api: Api) -> None:
    missing = _is_problem(api.client.get("/api/v1/devices"), 401)
    assert "Authorization: Bearer" in missing["detail"] and missing["instance"] == "/api/v1/devices"
    unknown = _is_problem(api.client.get("/api/v1/devices", headers=_auth("esf_nope_nope")), 401)
    assert "not known" in unknown["detail"]
    assert "not an operator token" in _is_problem(api.client.get("/api/v1/devices", headers=_auth("x")), 401)["detail"]
    token_id, token = tokens.create_token(api.engine, name="short-lived", role="viewer", created_by="t")
    assert api.client.get("/api/v1/devices", headers=_auth(token)).status_code == 200
    revoked = api.client.delete(f"/api/v1/tokens/{token_id}", headers=api.as_("admin"))
    assert revoked.status_code == 200 and revoked.json()["revoked"] is not None
    assert (
        f"token {token_id} was revoked"
        in _is_problem(api.client.get("/api/v1/devices", headers=_auth(token)), 401)["detail"]
    )
    _is_problem(api.client.delete(f"/api/v1/tokens/{token_id}", headers=api.as_("admin")), 409)
    _is_problem(api.client.delete("/api/v1/tokens/nope", headers=api.as_("admin")), 404)
    _is_problem(api.client.delete(f"/api/v1/tokens/{token_id}", headers=api.as_("operator")), 403)


def test_validation_errors_are_problems_naming_the_field_the_value_and_the_allowed_values(api: Api) -> None:
    banana = _is_problem(api.client.get("/api/v1/devices?state=banana", headers=api.as_("viewer")), 422)
    (error,) = banana["errors"]
    assert error["field"] == "query.state" and error["value"] == "banana"
    assert "'online'" in error["message"] and "'COMMITTED'" in error["message"]
    assert "query.state" in banana["detail"]
    bad = _is_problem(
        api.client.post("/api/v1/deployments", json=_rollout(api, expires_s=1e300), headers=api.as_("operator")), 422
    )
    assert [e["field"] for e in bad["errors"]] == ["body.expires_s"] and bad["errors"][0]["value"] == 1e300
    _is_problem(api.client.get("/api/v1/deployments?state=DONE", headers=api.as_("viewer")), 422)
    _is_problem(api.client.get("/api/v1/bundles?limit=0", headers=api.as_("viewer")), 422)
    _is_problem(api.client.get("/api/v1/nowhere", headers=api.as_("viewer")), 404)
    coarse = api.client.get("/api/v1/devices/dev-1/history?resolution=hourly", headers=api.as_("viewer"))
    assert "'minute'" in _is_problem(coarse, 422)["errors"][0]["message"]


def test_a_rollout_to_an_unknown_device_is_refused_and_a_taken_id_is_a_conflict(api: Api) -> None:
    operator = api.as_("operator")
    ghost = _is_problem(
        api.client.post("/api/v1/deployments", json=_rollout(api, devices=["dev-1", "ghost-7"]), headers=operator), 422
    )
    assert "'ghost-7'" in ghost["detail"] and "'dev-1'" not in ghost["detail"]
    nobody = api.client.post("/api/v1/deployments", json=_rollout(api, devices=None, group="ghosts"), headers=operator)
    assert "'ghosts'" in _is_problem(nobody, 422)["detail"]  # an unknown group: the same answer
    created = api.client.post("/api/v1/deployments", json=_rollout(api, deployment_id="dup-1"), headers=operator)
    assert created.status_code == 201, created.text
    assert str(api.root) not in created.text  # no server path (the bundle's file is named, not its place)
    again = _is_problem(
        api.client.post("/api/v1/deployments", json=_rollout(api, deployment_id="dup-1"), headers=operator), 409
    )
    assert "'dup-1'" in again["detail"]
    listed = api.client.get("/api/v1/deployments?state=PENDING", headers=api.as_("viewer")).json()
    assert [d["deployment_id"] for d in listed["items"]] == ["dup-1"] and listed["total"] == 1
    assert str(api.root) not in api.client.get("/api/v1/deployments/dup-1", headers=api.as_("viewer")).text


def test_an_unexpected_error_is_a_500_problem_without_internals(api: Api) -> None:
    created = api.client.post(
        "/api/v1/deployments", json=_rollout(api, deployment_id="boom"), headers=api.as_("operator")
    )
    assert created.status_code == 201, created.text
    answer = api.client.post("/api/v1/deployments/boom/abort", headers=api.as_("operator"))
    failed = _is_problem(answer, 500)
    assert "secret" not in json.dumps(failed) and "Traceback" not in json.dumps(failed)
    assert (
        answer.headers["x-content-type-options"] == "nosniff"
        and "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    )


def test_bundles_are_listed_fetched_and_deleted_only_when_not_in_use(api: Api, tmp_path: Path) -> None:
    viewer, operator = api.as_("viewer"), api.as_("operator")
    one = api.client.get(f"/api/v1/bundles/{api.bundle_id}", headers=viewer)
    assert one.status_code == 200 and "path" not in one.json() and str(api.root) not in one.text
    assert one.json()["model_name"] == "digits"
    listed = api.client.get("/api/v1/bundles?limit=1", headers=viewer).json()
    assert listed["total"] >= 1 and listed["limit"] == 1 and len(listed["items"]) == 1
    _is_problem(api.client.get("/api/v1/bundles/nope", headers=viewer), 404)
    api.client.post("/api/v1/deployments", json=_rollout(api, deployment_id="holds-it"), headers=operator)
    in_use = _is_problem(api.client.delete(f"/api/v1/bundles/{api.bundle_id}", headers=operator), 409)
    assert "holds-it" in in_use["detail"]
    _is_problem(api.client.delete(f"/api/v1/bundles/{api.bundle_id}", headers=viewer), 403)
    other = placeholder_bundle(tmp_path, make_keys(tmp_path / "keys"))
    spare = api.client.post("/api/v1/bundles?filename=spare.edgepkg", content=other.read_bytes(), headers=operator)
    assert spare.status_code == 201 and "path" not in spare.json()
    spare_id = spare.json()["id"]
    assert api.client.delete(f"/api/v1/bundles/{spare_id}", headers=operator).status_code == 200
    _is_problem(api.client.get(f"/api/v1/bundles/{spare_id}", headers=viewer), 404)
    assert not (api.root / "bundles" / f"{spare.json()['sha256']}.edgepkg").exists()
    garbage = _is_problem(api.client.post("/api/v1/bundles?filename=x.edgepkg", content=b"junk", headers=operator), 400)
    assert str(api.root) not in garbage["detail"] and "x.edgepkg" in garbage["detail"]


def test_devices_groups_and_alerts_are_pages_and_the_list_carries_latest(api: Api) -> None:
    viewer = api.as_("viewer")
    page = api.client.get("/api/v1/devices?limit=2&offset=1", headers=viewer).json()
    assert [d["device_id"] for d in page["items"]] == ["dev-2", "dev-3"] and page["total"] == 3
    assert [d["latest"]["p95_ms"] for d in page["items"]] == [3.0, 4.0]  # what fleet devices --server shows
    groups = api.client.get("/api/v1/groups", headers=viewer).json()
    assert groups["items"] == [
        {"group": "g0", "devices": 2, "online": 2},
        {"group": "g1", "devices": 1, "online": 1},
        {"group": "line-1", "devices": 3, "online": 3},
    ]
    alerts = api.client.get("/api/v1/alerts", headers=viewer).json()
    assert alerts["total"] == len(alerts["items"]) and all("message" in a for a in alerts["items"])


def test_decommissioning_a_device_removes_its_broker_password_and_revokes_its_enrollment(api: Api) -> None:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from edgesdk.fleet.enrollment import RegistryFile

    registry = RegistryFile(api.root / "enrollment.json")
    registry.approve("dev-2", X25519PrivateKey.generate().public_key(), profile="rpi5-8gb")
    _is_problem(api.client.delete("/api/v1/devices/dev-2", headers=api.as_("operator")), 403)
    assert registry.load().devices["dev-2"].status == "approved"  # the refused call changed nothing
    done = api.client.delete("/api/v1/devices/dev-2", headers=api.as_("admin"))
    assert done.status_code == 200, done.text
    assert done.json() == {"device_id": "dev-2", "broker_credentials_removed": True, "enrollment_revoked": True}
    assert registry.load().devices["dev-2"].status == "revoked"  # no key slot in bundles packaged from now on
    assert (api.root / "passwords").read_text().startswith("dev-1:") and "dev-2" not in (
        api.root / "passwords"
    ).read_text()
    _is_problem(api.client.get("/api/v1/devices/dev-2", headers=api.as_("viewer")), 404)
    _is_problem(api.client.delete("/api/v1/devices/dev-2", headers=api.as_("admin")), 404)


def test_every_refused_write_is_audited_with_its_status(api: Api) -> None:
    operator = api.as_("operator")
    api.client.post("/api/v1/deployments/nope/abort", headers=operator)  # 404
    api.client.post("/api/v1/deployments", json=_rollout(api, canary=7), headers=operator)  # 422
    api.client.post("/api/v1/deployments", json=_rollout(api, deployment_id="audit-1"), headers=operator)
    api.client.post("/api/v1/deployments", json=_rollout(api, deployment_id="audit-1"), headers=operator)  # 409
    api.client.delete("/api/v1/bundles/x", headers={"Authorization": "Bearer esf_bad_bad"})  # 401
    newest = [
        (e["action"], e["target"], e["outcome"], e["detail"].get("status")) for e in audit.entries(api.engine, limit=5)
    ]
    assert newest == [
        ("bundle.delete", "x", "refused", 401),
        ("deployment.create", "", "refused", 409),
        ("deployment.create", "audit-1", "ok", None),
        ("deployment.create", "", "refused", 422),
        ("deployment.abort", "nope", "refused", 404),
    ]
    (entry,) = [e for e in audit.entries(api.engine, limit=5) if e["detail"].get("status") == 404]
    assert entry["actor"].startswith("operator-p") and entry["role"] == "operator"


def test_healthz_follows_the_broker_connection_without_a_token(api: Api) -> None:
    ok = api.client.get("/healthz")
    assert ok.status_code == 200 and ok.json() == {"status": "ok", "broker": api.broker["now"].as_dict()}
    connected = api.broker["now"]
    api.broker["now"] = replace(connected, connected=False, disconnects=1)
    try:
        lost = api.client.get("/healthz")
        assert lost.status_code == 503 and lost.json()["status"] == "degraded"
        assert lost.json()["broker"]["connected"] is False and lost.json()["broker"]["disconnects"] == 1
    finally:
        api.broker["now"] = connected


def test_the_openapi_document_names_parameters_types_answers_and_documents_problems(api: Api) -> None:
    document = api.client.get("/openapi.json").json()
    assert not [path for path in document["paths"] if "{item}" in path]
    assert {
        "/api/v1/devices/{device_id}",
        "/api/v1/deployments/{deployment_id}/abort",
        "/api/v1/bundles/{bundle_id}",
        "/api/v1/tokens/{token_id}",
        "/api/v1/groups",
        "/api/v1/alerts",
        "/healthz",
    } <= set(document["paths"])
    assert "Problem" in document["components"]["schemas"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if not path.startswith("/api/v1/"):
                continue
            ok = next(status for status in operation["responses"] if status.startswith("2"))
            content = operation["responses"][ok]["content"]
            if "application/json" not in content:  # a file download (a capture): its bytes, documented
                assert content["application/octet-stream"]["schema"]["format"] == "binary", (method, path)
            else:
                schema = content["application/json"]["schema"]
                assert schema.get("$ref") or schema.get("type") == "array", (method, path, schema)
            for status in ("401", "403", "422"):
                answer = operation["responses"][status]
                assert PROBLEM in answer["content"], (method, path, status)
            if method == "get" and "Page_" in schema.get("$ref", ""):
                names = {p["name"] for p in operation.get("parameters", [])}
                assert {"limit", "offset"} <= names, path
    lists = [
        p for p, ops in document["paths"].items() if "Page_" in json.dumps(ops.get("get", {}).get("responses", {}))
    ]
    assert len(lists) >= 9, lists  # every list: devices, groups, alerts, deployments, security events, bundles, ...


def test_fleet_devices_through_the_server_shows_p95_errors_and_outbox(api: Api, edgesdk_cli, tmp_path: Path) -> None:
    from edgesdk.fleet.service.rest.server import ApiServer

    server = ApiServer(api.client.app, "127.0.0.1:0").start()
    try:
        token = tmp_path / "viewer.token"
        token.write_text(api.keys["viewer"])
        listing = edgesdk_cli(
            "fleet", "devices", "--server", f"http://127.0.0.1:{server.port}", "--token-file", str(token)
        )
    finally:
        server.stop()
    assert listing.returncode == 0, listing.stderr
    (row,) = [line for line in listing.stdout.splitlines() if "dev-1" in line]
    assert "2.00" in row, listing.stdout  # dev-1's p95 from the list's `latest` (it was "-")


def test_security_events_are_a_typed_page_newest_first(api: Api) -> None:
    from edgesdk.fleet.service import schema
    from edgesdk.fleet.service.database import Transaction

    with Transaction(api.engine) as db:
        for n in range(3):
            db.execute(
                schema.security_events.insert().values(
                    ts=1000.0 + n, device_id="dev-1", msg_id=f"m{n}", kind="forged_command", deployment_id="sec-1",
                    command_sha256="c" * 64, why="signature", reason=f"refusal {n}",
                )
            )  # fmt: skip
    page = api.client.get("/api/v1/security-events?deployment_id=sec-1&limit=1&offset=1", headers=api.as_("viewer"))
    assert page.status_code == 200, page.text
    assert page.json()["total"] == 3 and [e["msg_id"] for e in page.json()["items"]] == ["m1"]
    assert api.client.get("/api/v1/security-events?deployment_id=other", headers=api.as_("viewer")).json()["total"] == 0
