"""The fleet service's web surface and the enrollment identity, through real processes
(issue 37, findings 10 and 3): a real ``edgesdk fleet serve`` started under umask 022, plain
HTTP requests, and the SHIPPED mosquitto config and ACL (``tests/shipped_mosquitto.py``).

Finding 10 — every answer carries CSP (``frame-ancestors 'none'``), nosniff, Referrer-Policy;
the dashboard cookie is a server-side session id (never the API token), HttpOnly,
SameSite=Strict, Secure behind an https ``--public-url``; ``/login`` needs its CSRF pair; the
write forms' CSRF still works; ``/metrics`` needs a token unless on ``--metrics-listen``; the
files the service creates are 0600 in 0700 directories.

Finding 3 — the bootstrap account (``edgesdk-enroll``) cannot publish as a device at the
broker; the service drops whatever arrives on that id's topics and never makes it a device;
enrollment requests make no device rows, and at most ``--max-pending-enrollments`` wait (the
rest refused and counted on ``/metrics``).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import stat
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.integration.conftest import require_mosquitto
from tests.pki_helpers import make_test_pki

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")

pytestmark = [pytest.mark.integration]

EDGESDK = [sys.executable, "-m", "edgesdk.cli.main"]


@dataclass
class Running:
    api: str  # http://HOST:PORT
    metrics: str | None  # http://HOST:PORT/metrics of --metrics-listen


@contextmanager
def fleet_serve(root: Path, broker: list[str], *extra: str) -> Iterator[Running]:
    """``edgesdk fleet serve --api 127.0.0.1:0`` started with umask 022 (the usual default)."""
    from edgesdk.keys import generate_publisher_key

    root.mkdir(parents=True, exist_ok=True)
    operator_key, _ = generate_publisher_key(root / "operator")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGESDK_FLEET")} | {"HOME": str(root)}
    argv = [*EDGESDK, "fleet", "serve", *broker, "--operator-key", str(operator_key), "--api", "127.0.0.1:0", *extra]
    log = root / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env, preexec_fn=lambda: os.umask(0o022)
        )
        try:
            assert proc.stdout is not None
            banner = proc.stdout.readline()
            api = re.search(r"API on (http://\S+)", banner)
            assert api, banner + log.read_text()[-2000:]
            metrics = re.search(r"metrics on (http://\S+/metrics)", banner)
            yield Running(api.group(1), metrics.group(1) if metrics else None)
        finally:
            proc.terminate()
            proc.wait(60)


def token(data_dir: Path, role: str) -> str:
    made = subprocess.run(
        [*EDGESDK, "fleet", "serve", "token", "create", "--role", role, "--name", role, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def request(
    base: str, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    """One request, redirects NOT followed (the cookies and Location are the subject)."""
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def get_text(base: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    return response.status, text


def cookies(response: http.client.HTTPResponse) -> dict[str, str]:
    """name → the whole Set-Cookie line."""
    return {line.split("=", 1)[0]: line for line in response.headers.get_all("set-cookie") or []}


def cookie_value(line: str) -> str:
    return line.split("=", 1)[1].split(";", 1)[0]


def form(fields: dict[str, str]) -> bytes:
    return urllib.parse.urlencode(fields).encode()


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def sign_in(base: str, secret: str) -> http.client.HTTPResponse:
    """The browser's way: GET /login (its CSRF cookie and field), then POST the form."""
    page_url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(page_url.hostname, page_url.port, timeout=30)
    conn.request("GET", "/login")
    page = conn.getresponse()
    html = page.read().decode()
    conn.close()
    csrf = re.search(r'name=csrf value="([^"]+)"', html)
    assert csrf, html
    login_cookie = cookie_value(cookies(page)["edgesdk_fleet_login"])
    return request(
        base,
        "POST",
        "/login",
        body=form({"csrf": csrf.group(1), "token": secret}),
        headers={**FORM, "Cookie": f"edgesdk_fleet_login={login_cookie}"},
    )


def modes(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` whose mode lets anyone else in: path → mode."""
    loose = {}
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        wanted = 0o700 if path.is_dir() else 0o600
        if mode & ~wanted:
            loose[str(path.relative_to(root))] = oct(mode)
    return loose


def test_web_headers_session_cookie_csrf_metrics_and_file_modes(mqtt_broker, tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = ["--broker", mqtt_broker.url]
    viewer, operator = token(data, "viewer"), token(data, "operator")
    with fleet_serve(tmp_path / "svc", broker, "--data-dir", str(data), "--metrics-listen", "127.0.0.1:0") as svc:
        base = svc.api
        # (a) headers on a page, a JSON answer, a refusal
        for method, path in (("GET", "/login"), ("GET", "/api/v1/devices"), ("GET", "/openapi.json")):
            answer = request(base, method, path)
            csp = answer.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, (path, csp)
            assert "unsafe-inline" not in csp.split("script-src", 1)[1].split(";")[0], csp  # scripts by hash only
            assert answer.headers["x-content-type-options"] == "nosniff", path
            assert answer.headers["x-frame-options"] == "DENY", path
            assert answer.headers["referrer-policy"] == "no-referrer", path

        # (c) /login without this dashboard's CSRF pair: no session, whatever the token
        forged = request(base, "POST", "/login", body=form({"token": operator}), headers=FORM)
        assert forged.status == 303 and "error=" in forged.headers["location"]
        assert "edgesdk_fleet_session" not in cookies(forged)
        mismatched = request(
            base,
            "POST",
            "/login",
            body=form({"token": operator, "csrf": "attacker-chosen"}),
            headers={**FORM, "Cookie": "edgesdk_fleet_login=something-else"},
        )
        assert "edgesdk_fleet_session" not in cookies(mismatched)

        # (b) a server-side session id: not the token, HttpOnly, SameSite=Strict, no Secure on http
        signed = sign_in(base, operator)
        assert signed.status == 303 and signed.headers["location"] == "/", signed.headers
        line = cookies(signed)["edgesdk_fleet_session"]
        session = cookie_value(line)
        assert session and session != operator and operator.split("_", 2)[-1] not in line  # esf_<id>_<secret>
        attributes = {a.strip().lower() for a in line.split(";")[1:]}
        assert "httponly" in attributes and "samesite=strict" in attributes and "secure" not in attributes
        status, page = get_text(base, "/", {"Cookie": f"edgesdk_fleet_session={session}"})
        assert status == 200 and "id=devices" in page
        token_as_cookie = request(base, "GET", "/", headers={"Cookie": f"edgesdk_fleet_session={operator}"})
        assert token_as_cookie.status == 303  # the API token itself is no session

        # the write forms' CSRF (derived from the session) still decides
        csrf = re.search(r'name=csrf value="([0-9a-f]+)"', page)
        assert csrf, page[-2000:]
        session_cookie = {"Cookie": f"edgesdk_fleet_session={session}", **FORM}
        stale = request(
            base, "POST", "/ui/deployments/d-none/abort", body=form({"csrf": "0" * 32}), headers=session_cookie
        )
        assert "stale" in urllib.parse.unquote(stale.headers["location"])
        sent = request(
            base, "POST", "/ui/deployments/d-none/abort", body=form({"csrf": csrf.group(1)}), headers=session_cookie
        )
        assert "stale" not in urllib.parse.unquote(sent.headers["location"])  # past the CSRF check

        # signing out ends the session on the server: the copied cookie is worth nothing after
        request(base, "GET", "/logout", headers={"Cookie": f"edgesdk_fleet_session={session}"})
        assert request(base, "GET", "/", headers={"Cookie": f"edgesdk_fleet_session={session}"}).status == 303

        # (d) /metrics: a token on the API's listener; none on its own listener, which has nothing else
        assert request(base, "GET", "/metrics").status == 401
        status, page = get_text(base, "/metrics", {"Authorization": f"Bearer {viewer}"})
        assert status == 200 and "edgesdk_fleet_devices" in page
        assert svc.metrics is not None
        status, page = get_text(svc.metrics.removesuffix("/metrics"), "/metrics")
        assert status == 200 and "edgesdk_fleet_ingest_total" in page
        assert request(svc.metrics.removesuffix("/metrics"), "GET", "/api/v1/devices").status == 404

        # (e) a bundle upload that fails still made DATA/bundles; everything is private
        request(
            base,
            "POST",
            "/api/v1/bundles",
            body=b"not a bundle",
            headers={"Authorization": f"Bearer {operator}", "Content-Type": "application/octet-stream"},
        )
        assert (data / "bundles").is_dir()
        assert (data / "fleet-service.sqlite3").is_file()
        assert modes(data) == {}

    # Secure cookies behind an https --public-url (a TLS proxy in front of --api)
    with fleet_serve(
        tmp_path / "svc2", broker, "--data-dir", str(data), "--public-url", "https://fleet.example"
    ) as svc:
        login = request(svc.api, "GET", "/login")
        assert "secure" in {a.strip().lower() for a in cookies(login)["edgesdk_fleet_login"].split(";")}
        signed = sign_in(svc.api, operator)
        assert "secure" in {a.strip().lower() for a in cookies(signed)["edgesdk_fleet_session"].split(";")}


def test_bad_web_flags_are_one_line_errors(tmp_path: Path) -> None:
    from tests.conftest import assert_one_line_error

    base = [*EDGESDK, "fleet", "serve", "--broker", "mqtt://127.0.0.1:1", "--data-dir", str(tmp_path)]
    bad = subprocess.run([*base, "--metrics-listen", "localhost:http"], capture_output=True, text=True, timeout=60)
    assert_one_line_error(bad, "--metrics-listen", "'localhost:http'")
    bad = subprocess.run([*base, "--public-url", "fleet.example"], capture_output=True, text=True, timeout=60)
    assert_one_line_error(bad, "--public-url", "'fleet.example'")


# -- finding 3: the enrollment identity ----------------------------------------------------------


def _wait(predicate, timeout: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def _device_messages(device_id: str) -> dict[str, bytes]:
    """Valid presence, telemetry, event and OTA status payloads claiming ``device_id``."""
    from edgesdk.schemas.messages import Event, OtaStatus, Presence, Telemetry

    now = datetime.now(timezone.utc)
    return {
        "presence": Presence(device_id=device_id, online=True, ts=now, groups=["line-1"]).model_dump_json().encode(),
        "telemetry": Telemetry(device_id=device_id, msg_id="t1", seq=1, ts=now).model_dump_json().encode(),
        "events": Event(device_id=device_id, msg_id="e1", seq=1, ts=now, event="boot").model_dump_json().encode(),
        "ota/status": OtaStatus(device_id=device_id, deployment_id="d1", msg_id="o1", ts=now, state="FAILED")
        .model_dump_json()
        .encode(),
    }


def test_the_bootstrap_account_is_never_a_device(tmp_path: Path) -> None:
    require_mosquitto()
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from edgesdk.agent.enrollment import enrollment_request

    from tests.shipped_mosquitto import shipped_broker, shipped_client

    pki = make_test_pki(tmp_path / "pki", [])
    data = tmp_path / "data"
    viewer, operator = token(data, "viewer"), token(data, "operator")
    (tmp_path / "op.password").write_text("op\n")
    with shipped_broker(tmp_path / "broker", pki, {}) as broker:
        observer = shipped_client(broker, "operators", "observer", "fleet-operator", "op")
        bootstrap = shipped_client(broker, "enrollment", "x", "edgesdk-enroll", "enroll")
        seen: list[tuple[str, bytes]] = []
        observer.on_message = lambda topic, payload: seen.append((topic, payload))
        for client in (observer, bootstrap):
            client.start()
            assert client.wait_connected(60), client.stats.last_error
        observer.subscribe("edgesdk/devices/#", qos=1)
        time.sleep(0.3)
        serve_broker = ["--broker", broker.url("operators"), "--username", "fleet-operator"]
        serve_broker += ["--password-file", str(tmp_path / "op.password"), "--ca-file", str(pki.ca_file)]
        extra = ["--data-dir", str(data), "--metrics-listen", "127.0.0.1:0", "--max-pending-enrollments", "10"]
        try:
            with fleet_serve(tmp_path / "svc", serve_broker, *extra) as svc:
                assert svc.metrics is not None
                scrape = svc.metrics.removesuffix("/metrics")

                def counter(kind: str) -> float:
                    _status, page = get_text(scrape, "/metrics")
                    found = re.search(rf'edgesdk_fleet_ingest_total{{kind="{kind}"}} (\S+)', page)
                    return float(found.group(1)) if found else 0.0

                # At the broker: the bootstrap account may not speak as the "device" edgesdk-enroll.
                from_bootstrap = _device_messages("edgesdk-enroll")
                for suffix, payload in from_bootstrap.items():
                    bootstrap.publish(f"edgesdk/devices/edgesdk-enroll/{suffix}", payload, qos=1)
                # At the service: even what the operator account (which may write anywhere) puts
                # on that id's topics is dropped, and a real device's presence is taken.
                operator_client = shipped_client(broker, "operators", "op2", "fleet-operator", "op")
                operator_client.start()
                assert operator_client.wait_connected(60), operator_client.stats.last_error
                forged = _device_messages("edgesdk-enroll")
                operator_client.publish("edgesdk/devices/edgesdk-enroll/presence", forged["presence"], qos=1)
                operator_client.publish("edgesdk/devices/edgesdk-enroll/ota/status", forged["ota/status"], qos=1)
                operator_client.publish(
                    "edgesdk/devices/cam-real/presence", _device_messages("cam-real")["presence"], qos=1
                )
                # A flood of retained enrollment requests for new ids, over the pending limit (10).
                keys = {f"flood-{i:02d}": X25519PrivateKey.generate() for i in range(25)}
                for device_id, key in keys.items():
                    message = enrollment_request(device_id, key.public_key().public_bytes_raw())
                    bootstrap.publish(
                        f"edgesdk/devices/{device_id}/enroll", message.model_dump_json().encode(), qos=1, retain=True
                    )
                assert _wait(lambda: counter("enroll_requests") + counter("enroll_refused") >= 25), (
                    tmp_path / "svc" / "serve.log"
                ).read_text()[-3000:]

                def api(path: str, secret: str):  # type: ignore[no-untyped-def]
                    status, text = get_text(svc.api, path, {"Authorization": f"Bearer {secret}"})
                    assert status == 200, text
                    return json.loads(text)

                # cam-real's presence came after the forged ones, on the same connection: in order.
                assert _wait(lambda: api("/api/v1/devices", viewer)["total"] >= 1)
                devices = [d["device_id"] for d in api("/api/v1/devices", viewer)["items"]]
                assert devices == ["cam-real"]  # not edgesdk-enroll, not one of the enrolling ids
                assert _wait(lambda: counter("not_a_device") >= 2)
                pending = api("/api/v1/enrollment", viewer)["items"]
                assert len(pending) == 10 and counter("enroll_refused") == 15
                assert counter("unstorable") == 0
                operator_client.stop()

                # The bootstrap account's messages never left the broker (its enrollment requests did).
                assert _wait(lambda: any(t.endswith("/flood-24/enroll") for t, _ in seen))
                assert [t for t, p in seen if p in from_bootstrap.values()] == []

                # An approval writes the registry: private, like everything under the data dir.
                first = pending[0]
                approved = request(
                    svc.api,
                    "POST",
                    f"/api/v1/enrollment/{first['device_id']}/approve",
                    body=json.dumps({"key_id": first["key_id"]}).encode(),
                    headers={"Authorization": f"Bearer {operator}", "Content-Type": "application/json"},
                )
                assert approved.status == 200
                assert stat.S_IMODE((data / "enrollment.json").stat().st_mode) == 0o600
                assert modes(data) == {}
        finally:
            observer.stop()
            bootstrap.stop()
