"""Server-side device tags, dynamic groups and webhooks (issue 40) through the real app
(FastAPI's TestClient, SQLite and a real PostgreSQL, the real ingest, a real uploaded bundle) and real HTTP
receivers (``http.server`` on 127.0.0.1) that check each delivery's HMAC signature:

* tags are set and removed over REST (unknown device 404, bad key 422); a saved filter
  (``tag.site=berlin and profile=pi5``) selects devices, a bad one is a 422 naming its token;
  a rollout to a filter takes the devices it selects when the rollout is created;
* webhooks (admin only): a link-local/metadata URL is refused, the secret is never shown back;
  a rollout's state change and an alert reach the receivers signed (Alertmanager's payload for
  a webhook asking for it); a receiver that is down is retried, then recorded as failed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
pytest.importorskip("fastapi", reason="the fleet service API needs fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from edgesdk.errors import UsageError  # noqa: E402
from edgesdk.fleet.deployments import ABORTED  # noqa: E402
from edgesdk.fleet.service import audit, tokens, webhooks  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest  # noqa: E402
from edgesdk.fleet.service.rest.app import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402
from tests.bundle_helpers import make_keys, placeholder_bundle  # noqa: E402
from tests.pg_helpers import throwaway_cluster  # noqa: E402
from tests.webhook_receiver import closed_port, running_receiver  # noqa: E402

SECRET = "a-webhook-secret-of-some-length"


@dataclass
class Fleet:
    client: TestClient
    keys: dict[str, str]
    engine: Any
    store: SqlRolloutStore
    ingest: Ingest
    bundle_id: str

    def as_(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"}

    def presence(self, device: str, *, online: bool = True, profile: str = "pi5", groups: tuple[str, ...] = ()) -> None:
        now = datetime.now(timezone.utc).isoformat()
        presence = {"device_id": device, "online": online, "ts": now, "profile": profile, "groups": list(groups)}
        self.ingest.handle(f"edgesdk/devices/{device}/presence", json.dumps(presence).encode())
        assert self.ingest.drain(10)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Any]:
    with throwaway_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("targeting")
    if request.param == "sqlite":
        engine = open_engine(f"sqlite:///{root / 'api.sqlite3'}")
    else:  # a real PostgreSQL (the quoted "window" column, the same queries)
        engine = open_engine(request.getfixturevalue("postgres").create_database("targeting"))
    migrate(engine)
    store = SqlRolloutStore(engine)
    retries = {webhooks.ATTEMPTS_ENV: "3", webhooks.BACKOFF_ENV: "0.2"}
    saved = {name: os.environ.get(name) for name in retries}
    os.environ.update(retries)  # read once, when the app starts its notifier
    try:
        app = create_app(ApiContext(engine=engine, store=store, commands=None, data_dir=root))  # type: ignore[arg-type]
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    keys = {role: tokens.create_token(engine, name=f"{role}-p", role=role, created_by="t")[1] for role in tokens.ROLES}
    ingest = Ingest(engine, "edgesdk", store).start()
    with TestClient(app) as client:
        bundle = placeholder_bundle(root, make_keys(root / "keys"))
        uploaded = client.post(
            "/api/v1/bundles?filename=digits.edgepkg",
            content=bundle.read_bytes(),
            headers={"Authorization": f"Bearer {keys['operator']}"},
        )
        assert uploaded.status_code == 201, uploaded.text
        fleet = Fleet(client, keys, engine, store, ingest, uploaded.json()["id"])
        fleet.presence("dev-1", profile="pi5", groups=("line-1",))
        fleet.presence("dev-2", profile="x86")
        fleet.presence("dev-3", profile="pi5")
        yield fleet
        app.state.webhooks.stop()
    ingest.stop()
    engine.dispose()


def test_operator_tags_and_saved_filters_pick_a_rollouts_devices_when_it_is_created(fleet: Fleet) -> None:
    client, operator = fleet.client, fleet.as_("operator")
    for device, site in (("dev-1", "berlin"), ("dev-2", "berlin"), ("dev-3", "paris")):
        tagged = client.put(f"/api/v1/devices/{device}/tags/site", json={"value": site}, headers=operator)
        assert tagged.status_code == 200 and tagged.json()["tags"] == {"site": site}, tagged.text
    assert client.put("/api/v1/devices/ghost/tags/site", json={"value": "x"}, headers=operator).status_code == 404
    assert client.put("/api/v1/devices/dev-1/tags/bad%20key", json={"value": "x"}, headers=operator).status_code == 422
    assert (
        client.put("/api/v1/devices/dev-1/tags/site", json={"value": "x"}, headers=fleet.as_("viewer")).status_code
        == 403
    )

    saved = client.put(
        "/api/v1/target-filters/berlin-pi5", json={"where": "tag.site=berlin and profile=pi5"}, headers=operator
    )
    assert saved.status_code == 200 and saved.json()["devices"] == ["dev-1"], saved.text
    bad = client.put("/api/v1/target-filters/bad", json={"where": "tag.site=berlin or profile=pi5"}, headers=operator)
    assert bad.status_code == 422 and "'or'" in bad.json()["detail"], bad.text
    unknown_field = client.put("/api/v1/target-filters/bad", json={"where": "colour=red"}, headers=operator)
    assert unknown_field.status_code == 422 and "'colour'" in unknown_field.json()["detail"]

    rollout = {"bundle_id": fleet.bundle_id, "canary": 0, "waves": [1.0], "target_filter": "berlin-pi5"}
    created = client.post("/api/v1/deployments", json={**rollout, "deployment_id": "by-filter"}, headers=operator)
    assert created.status_code == 201, created.text
    # dev-3 moves to Berlin after the rollout was made: the filter selects it now, the rollout keeps its devices.
    client.put("/api/v1/devices/dev-3/tags/site", json={"value": "berlin"}, headers=operator)
    assert client.get("/api/v1/target-filters/berlin-pi5", headers=operator).json()["devices"] == ["dev-1", "dev-3"]
    detail = client.get("/api/v1/deployments/by-filter", headers=operator).json()
    assert [d["device_id"] for d in detail["device_states"]] == ["dev-1"]

    where = {**rollout, "target_filter": None, "where": "group=line-1 and tag.site!=paris", "deployment_id": "by-where"}
    assert client.post("/api/v1/deployments", json=where, headers=operator).status_code == 201
    nobody = client.post(
        "/api/v1/deployments", json={**where, "where": "profile=riscv", "deployment_id": "n"}, headers=operator
    )
    assert nobody.status_code == 422 and "no known device" in nobody.json()["detail"]
    missing = client.post("/api/v1/deployments", json={**rollout, "target_filter": "nope"}, headers=operator)
    assert missing.status_code == 404 and "'nope'" in missing.json()["detail"]

    assert client.delete("/api/v1/devices/dev-3/tags/site", headers=operator).json()["tags"] == {}
    assert client.delete("/api/v1/devices/dev-3/tags/site", headers=operator).status_code == 404
    assert client.delete("/api/v1/target-filters/berlin-pi5", headers=operator).json()["name"] == "berlin-pi5"
    assert client.get("/api/v1/target-filters/berlin-pi5", headers=operator).status_code == 404
    actions = {(e["action"], e["outcome"]) for e in audit.entries(fleet.engine, limit=200)}
    assert {("device.tag", "ok"), ("device.untag", "ok"), ("target_filter.save", "refused")} <= actions


def test_webhooks_are_signed_retried_and_never_show_their_secret(fleet: Fleet) -> None:
    with running_receiver() as receiver:
        _signed_retried_secret_kept(fleet, receiver)


def _signed_retried_secret_kept(fleet: Fleet, receiver: Any) -> None:
    client, admin = fleet.client, fleet.as_("admin")
    hook = {"url": receiver.url, "secret": SECRET, "events": ["rollout."]}
    assert client.post("/api/v1/webhooks", json=hook, headers=fleet.as_("operator")).status_code == 403
    metadata = client.post("/api/v1/webhooks", json={**hook, "url": "http://169.254.169.254/latest"}, headers=admin)
    assert metadata.status_code == 422 and "169.254.169.254" in metadata.json()["detail"], metadata.text
    assert client.post("/api/v1/webhooks", json={**hook, "url": "file:///etc/passwd"}, headers=admin).status_code == 422
    assert client.post("/api/v1/webhooks", json=hook, headers=admin).status_code == 201
    alerts = {**hook, "events": ["alert."], "format": "alertmanager"}
    assert client.post("/api/v1/webhooks", json=alerts, headers=admin).status_code == 201
    dead = client.post("/api/v1/webhooks", json={**hook, "url": f"http://127.0.0.1:{closed_port()}/"}, headers=admin)
    assert dead.status_code == 201
    listed = client.get("/api/v1/webhooks", headers=admin)
    assert listed.json()["total"] == 3 and SECRET not in listed.text and "secret" not in listed.text
    # The notifier's first look at the fleet (changes since it are what it reports): waited for,
    # since a loaded machine may run its thread later than a fixed 1.5 s (then nothing to report).
    notifier = client.app.state.webhooks
    deadline = time.monotonic() + 60
    while notifier._states is None or notifier._alerts is None:
        assert time.monotonic() < deadline, "the webhook notifier never looked at the fleet"
        time.sleep(0.05)

    rollout = {"bundle_id": fleet.bundle_id, "canary": 0, "waves": [1.0], "devices": ["dev-2"]}
    created = client.post("/api/v1/deployments", json={**rollout, "deployment_id": "hooked"}, headers=admin)
    assert created.status_code == 201, created.text
    fleet.store.set_state("hooked", ABORTED, reason="by hand")
    headers, body = receiver.wait_for("rollout.aborted")
    timestamp, signature = headers["X-Edgesdk-Timestamp"], headers["X-Edgesdk-Signature"]
    assert signature.startswith("sha256=") and webhooks.verify(SECRET, timestamp, body, signature)
    assert not webhooks.verify(SECRET, timestamp, body.replace(b"hooked", b"hacked"), signature)
    assert not webhooks.verify("another-secret-entirely", timestamp, body, signature)
    assert not webhooks.verify(SECRET, str(int(timestamp) - 3600), body, signature)  # a replay an hour later
    assert json.loads(body)["data"] == {"deployment_id": "hooked", "state": ABORTED}

    fleet.presence("dev-3", online=False)  # its Last Will: an offline alert fires
    headers, body = receiver.wait_for("alert.firing", about=b'"dev-3"')
    assert webhooks.verify(SECRET, headers["X-Edgesdk-Timestamp"], body, headers["X-Edgesdk-Signature"])
    manager = json.loads(body)
    assert manager["version"] == "4" and manager["status"] == "firing"
    assert manager["alerts"][0]["labels"] == {"alertname": "edgesdk_offline", "severity": "critical", "target": "dev-3"}
    assert not any(h.get("X-Edgesdk-Event") == "alert.firing" and b'"version"' not in b for h, b in receiver.got)

    dead_id = dead.json()["id"]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        records = client.get(f"/api/v1/webhooks/{dead_id}/deliveries", headers=admin).json()["items"]
        if records:
            break
        time.sleep(0.2)
    assert records and records[0]["outcome"] == "failed" and records[0]["attempts"] == 3, records
    assert "refused" in records[0]["error"].lower() or records[0]["error"], records
    assert client.delete(f"/api/v1/webhooks/{dead_id}", headers=admin).json()["id"] == dead_id
    assert client.get(f"/api/v1/webhooks/{dead_id}/deliveries", headers=admin).status_code == 404


def test_a_groups_maintenance_window_needs_an_operator_and_a_valid_window(fleet: Fleet) -> None:
    client, operator = fleet.client, fleet.as_("operator")
    body = {"window": "02:00-04:00", "window_tz": "Europe/Berlin"}
    assert client.put("/api/v1/groups/line-1/window", json=body, headers=fleet.as_("viewer")).status_code == 403
    bad = client.put("/api/v1/groups/line-1/window", json={"window": "2-4"}, headers=operator)
    assert bad.status_code == 422 and "'2-4'" in bad.json()["detail"]
    zone = client.put("/api/v1/groups/line-1/window", json={**body, "window_tz": "Mars/Base"}, headers=operator)
    assert zone.status_code == 422 and "'Mars/Base'" in zone.json()["detail"]
    assert client.put("/api/v1/groups/line-1/window", json=body, headers=operator).json() == {"group": "line-1", **body}
    assert client.get("/api/v1/group-windows", headers=fleet.as_("viewer")).json()["items"] == [
        {"group": "line-1", **body}
    ]
    rollout = {"bundle_id": fleet.bundle_id, "canary": 0, "waves": [1.0], "group": "line-1", "deployment_id": "g-w"}
    assert client.post("/api/v1/deployments", json=rollout, headers=operator).status_code == 201
    assert fleet.store.get("g-w").plan["window"] == "02:00-04:00"  # copied when the rollout was made
    assert client.delete("/api/v1/groups/line-1/window", headers=operator).status_code == 200
    assert client.get("/api/v1/groups/line-1/window", headers=operator).status_code == 404
    assert fleet.store.get("g-w").plan["window_tz"] == "Europe/Berlin"


def test_a_webhook_redirect_is_a_failed_try_and_link_local_needs_the_services_consent(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_receiver() as target:
        hits: list[str] = []

        class Redirect(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                hits.append(self.path)
                self.send_response(302)  # urllib would follow a 302 (as a GET); 307 it refuses for POST anyway
                self.send_header("Location", target.url)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/hook"
            made = fleet.client.post(
                "/api/v1/webhooks",
                json={"url": url, "secret": SECRET, "events": ["rollout.test"]},
                headers=fleet.as_("admin"),
            )
            assert made.status_code == 201, made.text
            fleet.client.app.state.webhooks.emit("rollout.test", {"deployment_id": "redirected"})
            hook = made.json()["id"]
            deadline = time.monotonic() + 10
            while not webhooks.deliveries(fleet.engine, hook) and time.monotonic() < deadline:
                time.sleep(0.1)
            records = webhooks.deliveries(fleet.engine, hook)
            assert records and records[0]["outcome"] == "failed" and records[0]["status"] == 302, records
            assert len(hits) == 3 and target.got == []  # every try hit the redirect; none followed it
        finally:
            server.shutdown()
            server.server_close()
            fleet.client.delete(f"/api/v1/webhooks/{made.json()['id']}", headers=fleet.as_("admin"))

    with pytest.raises(UsageError, match="169.254.169.254"):
        webhooks.check_url("http://169.254.169.254/latest/meta-data")
    with pytest.raises(UsageError, match="fe80::1"):
        webhooks.check_url("http://[fe80::1]/")
    monkeypatch.setenv(webhooks.ALLOW_LINK_LOCAL_ENV, "1")
    webhooks.check_url("http://169.254.169.254/latest/meta-data")  # the service's operator allowed it
