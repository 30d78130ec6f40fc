"""An approval is bound to the key the operator checked (issue 37, finding 1), and one key is
not approved for two devices without saying so: the service's ingest keeps the first key a
device requested with (another one is recorded beside it, never over it), the REST approval
names the full key id and is refused for any other, and the registry refuses a shared or a
revoked key under another device id. In-process: the real Ingest and API on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from edgesdk.agent.enrollment import enrollment_request

from edgesdk.errors import EnrollmentError
from edgesdk.fleet.enrollment import RegistryFile, encode_public_key, shared_key_devices
from edgesdk.keys import key_id
from tests.conftest import assert_one_line_error


def _kid(key: X25519PrivateKey) -> str:
    return key_id(key.public_key())


# -- the registry: one key, one device -------------------------------------------------------


def test_a_key_approved_for_one_device_is_refused_for_another_unless_allowed(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "reg.json")
    key = X25519PrivateKey.generate()
    registry.approve("cam-a", key.public_key())
    with pytest.raises(EnrollmentError, match=r"already approved for device 'cam-a'.*--allow-shared-key"):
        registry.approve("cam-b", key.public_key())
    assert set(registry.load().devices) == {"cam-a"}
    registry.approve("cam-b", key.public_key(), allow_shared_key=True)
    assert shared_key_devices(registry.load(), "cam-b", _kid(key)) == ["cam-a"]
    registry.approve("cam-b", key.public_key())  # approving it again as it is changes nothing


def test_a_key_revoked_for_one_device_never_comes_back_under_another_id(tmp_path: Path) -> None:
    registry = RegistryFile(tmp_path / "reg.json")
    stolen = X25519PrivateKey.generate()
    registry.approve("cam-a", stolen.public_key())
    registry.revoke("cam-a", reason="stolen")
    with pytest.raises(EnrollmentError, match=r"revoked for device 'cam-a'.*any device id"):
        registry.approve("cam-new", stolen.public_key(), allow_shared_key=True)


def test_cli_refuses_a_shared_key_in_one_line_and_warns_when_allowed(edgesdk_cli, tmp_path: Path) -> None:
    registry = str(tmp_path / "reg.json")
    key = encode_public_key(X25519PrivateKey.generate().public_key())
    base = ("fleet", "enroll", "approve")
    assert edgesdk_cli(*base, "cam-a", "--registry", registry, "--public-key", key).returncode == 0
    assert_one_line_error(
        edgesdk_cli(*base, "cam-b", "--registry", registry, "--public-key", key), "'cam-a'", "--allow-shared-key"
    )
    allowed = edgesdk_cli(*base, "cam-b", "--registry", registry, "--public-key", key, "--allow-shared-key")
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stderr.startswith("warning: key ") and "also approved for cam-a" in allowed.stderr
    assert f"in {registry}" in allowed.stdout  # says which registry it wrote: a local file, not a service's


def test_cli_key_id_is_the_full_id_and_required_for_a_key_read_off_the_network(edgesdk_cli, tmp_path: Path) -> None:
    key = X25519PrivateKey.generate()
    flags = ("--registry", str(tmp_path / "reg.json"), "--public-key", encode_public_key(key.public_key()))
    prefix = edgesdk_cli("fleet", "enroll", "approve", "cam-a", *flags, "--key-id", _kid(key)[:8])
    assert_one_line_error(prefix, _kid(key)[:8], "32 hex digits")
    service = ("--server", "http://127.0.0.1:9", "--token-file", str(tmp_path / "t"))
    (tmp_path / "t").write_text("esf_x_y\n")
    assert_one_line_error(edgesdk_cli("fleet", "enroll", "approve", "cam-a", *service), "--key-id", "edge-agent key")
    local = edgesdk_cli("fleet", "enroll", "approve", "cam-a", *service, *flags, "--key-id", _kid(key))
    assert_one_line_error(local, "--registry", "--public-key", "--server")
    assert not (tmp_path / "reg.json").exists()


# -- the service: ingest + REST approval -----------------------------------------------------


@pytest.fixture
def service(tmp_path: Path):
    pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
    pytest.importorskip("fastapi", reason="the fleet service API needs fastapi")
    from fastapi.testclient import TestClient

    from edgesdk.fleet.service import tokens
    from edgesdk.fleet.service.database import migrate, open_engine
    from edgesdk.fleet.service.ingest import Ingest
    from edgesdk.fleet.service.rest.app import ApiContext, create_app
    from edgesdk.fleet.service.store import SqlRolloutStore

    engine = open_engine(f"sqlite:///{tmp_path / 'svc.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    ingest = Ingest(engine, "edgesdk", store).start()
    context = ApiContext(
        engine=engine, store=store, commands=None, data_dir=tmp_path, registry_path=tmp_path / "enrollment.json"
    )  # type: ignore[arg-type]
    token = tokens.create_token(engine, name="op", role="operator", created_by="test")[1]
    with TestClient(create_app(context)) as client:
        client.headers["Authorization"] = f"Bearer {token}"

        def announce(device_id: str, key: X25519PrivateKey) -> None:
            request = enrollment_request(device_id, key.public_key().public_bytes_raw())
            ingest.handle(f"edgesdk/devices/{device_id}/enroll", request.model_dump_json().encode())
            assert ingest.drain(10)

        yield client, announce, RegistryFile(tmp_path / "enrollment.json")
    ingest.stop()
    engine.dispose()


def _row(client, device_id: str) -> dict:
    return {r["device_id"]: r for r in client.get("/api/v1/enrollment").json()["items"]}[device_id]


def test_a_second_key_for_a_pending_device_never_replaces_the_first(service) -> None:
    client, announce, registry = service
    device, attacker = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    announce("cam-a", device)
    announce("cam-a", attacker)  # the shared bootstrap account can write any device's enroll topic
    row = _row(client, "cam-a")
    assert (row["status"], row["key_id"], row["offered_key_id"]) == ("pending", _kid(device), _kid(attacker))

    missing = client.post("/api/v1/enrollment/cam-a/approve", json={})
    assert missing.status_code == 400 and "key_id" in missing.json()["detail"]
    prefix = client.post("/api/v1/enrollment/cam-a/approve", json={"key_id": _kid(device)[:8]})
    assert prefix.status_code == 422
    other = X25519PrivateKey.generate()
    wrong = client.post("/api/v1/enrollment/cam-a/approve", json={"key_id": _kid(other)})
    assert wrong.status_code == 409 and _kid(device) in wrong.json()["detail"]
    assert not registry.path.exists()

    approved = client.post("/api/v1/enrollment/cam-a/approve", json={"key_id": _kid(device)})
    assert approved.status_code == 200, approved.text
    assert approved.json()["key_id"] == _kid(device) and approved.json()["status"] == "approved"
    assert registry.load().devices["cam-a"].key_id == _kid(device)  # the key checked, not the last announced


def test_a_new_key_for_an_approved_device_is_a_rekey_request_that_needs_replace(service) -> None:
    client, announce, registry = service
    old, new = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    announce("cam-a", old)
    assert client.post("/api/v1/enrollment/cam-a/approve", json={"key_id": _kid(old)}).status_code == 200
    announce("cam-a", new)
    row = _row(client, "cam-a")
    assert (row["status"], row["key_id"], row["offered_key_id"]) == ("approved", _kid(old), _kid(new))  # not reset
    refused = client.post("/api/v1/enrollment/cam-a/approve", json={"key_id": _kid(new)})
    assert refused.status_code == 409 and "replace" in refused.json()["detail"]
    assert registry.load().devices["cam-a"].key_id == _kid(old)
    rekeyed = client.post("/api/v1/enrollment/cam-a/approve", json={"key_id": _kid(new), "replace": True})
    assert rekeyed.status_code == 200, rekeyed.text
    assert (rekeyed.json()["key_id"], rekeyed.json()["offered_key_id"]) == (_kid(new), None)
    entry = registry.load().devices["cam-a"]
    assert entry.key_id == _kid(new) and entry.revoked_key_ids == [_kid(old)]


def test_rest_refuses_a_shared_key_and_warns_when_allowed(service, caplog) -> None:
    client, announce, _registry = service
    key = X25519PrivateKey.generate()
    announce("cam-a", key)
    announce("cam-b", key)
    assert client.post("/api/v1/enrollment/cam-a/approve", json={"key_id": _kid(key)}).status_code == 200
    refused = client.post("/api/v1/enrollment/cam-b/approve", json={"key_id": _kid(key)})
    assert refused.status_code == 409 and "already approved for device 'cam-a'" in refused.json()["detail"]
    with caplog.at_level("WARNING", logger="edgesdk.fleet.service.rest.admin"):
        allowed = client.post("/api/v1/enrollment/cam-b/approve", json={"key_id": _kid(key), "allow_shared_key": True})
    assert allowed.status_code == 200, allowed.text
    assert "also approved for cam-a" in allowed.json()["warnings"][0]
    assert any("also approved for cam-a" in r.getMessage() for r in caplog.records)
