"""The fleet service's REST API refuses absurd numbers with a 4xx, never a 5xx (issue 37, findings 7
and 9, "bounds on every number"), against a real ``edgesdk fleet serve`` process over a real
mosquitto, with real operator and admin tokens:

* a rollout of an uploaded bundle whose commands would be valid until 2121 (``expires_s: 3e9``)
  or overflow a date (``1e300``), or with a non-finite number (``NaN``, which Python's JSON
  parser reads), is a 422 naming the field; the same rollout with a week's lifetime is created;
* schemathesis (the ``st`` command of the dev extra) fuzzes every operation of the service's
  own ``/openapi.json`` — schema examples, boundary values, then random data, valid and not —
  and asserts ``not_a_server_error``: not one 5xx. Bounded: a fixed seed, at most
  ``FUZZ_EXAMPLES`` cases per operation and ``FUZZ_SECONDS`` in all.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs the agent extra (paho-mqtt)")

from edgesdk.mqtt.broker import MosquittoBroker, find_mosquitto  # noqa: E402
from tests.bundle_helpers import make_keys, placeholder_bundle  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

FUZZ_EXAMPLES = 25
FUZZ_SECONDS = 45


@dataclass(frozen=True)
class Service:
    url: str
    tokens: dict[str, str]
    bundle_id: str
    log: Path
    passwords: Path = Path()

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None, role: str = "operator"):
        """(status, JSON answer) of one request; errors are answers here, not exceptions."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        if raw is None and body is not None:
            headers["Content-Type"] = "application/json"
        elif raw is not None:
            headers["Content-Type"] = "application/octet-stream" if "bundles" in path else "application/json"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            text = exc.read()
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, text.decode(errors="replace")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgesdk.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    if find_mosquitto() is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto; scripts/test installs it)")
    from edgesdk.keys import generate_publisher_key

    root = tmp_path_factory.mktemp("fleet-api-fuzz")
    broker = MosquittoBroker(data_dir=root / "mosquitto")
    broker.start()
    operator_key, _ = generate_publisher_key(root / "operator")
    db = f"sqlite:///{root / 'fleet.sqlite3'}"
    tokens = {}
    for role in ("operator", "admin"):
        made = _cli("fleet", "serve", "token", "create", "--role", role, "--name", f"fuzz-{role}", "--db", db, "--json")
        assert made.returncode == 0, made.stderr
        tokens[role] = json.loads(made.stdout)["token"]
    port = _free_port()
    log = root / "service.log"
    argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "serve", "--broker", broker.url, "--db", db]
    argv += ["--operator-key", str(operator_key), "--data-dir", str(root), "--api", f"127.0.0.1:{port}"]
    passwords = root / "device-passwords"  # lines as mosquitto_passwd writes them (decommission removes one)
    passwords.write_text("".join(f"{d}:$7$101$c2FsdA==$aGFzaA==\n" for d in ("dev-1", "dev-2")))
    argv += ["--device-passwords", str(passwords)]
    with open(log, "w") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/openapi.json", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"fleet serve did not answer (rc {proc.poll()}):\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
        for device_id in ("dev-1", "dev-2"):  # rollouts to devices the service never saw are refused
            _announce(broker.port, device_id, url, tokens["operator"])
        # A real bundle in the service, so a rollout request gets past "bundle not found" to the
        # numbers (random model bytes: the service never runs the model).
        bundle = placeholder_bundle(root, make_keys(root / "keys"))
        probe = Service(url, tokens, "", log)
        status, uploaded = probe.call("POST", "/api/v1/bundles?filename=digits.edgepkg", raw=bundle.read_bytes())
        assert status == 201, uploaded
        yield Service(url, tokens, uploaded["id"], log, passwords)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        broker.stop()


def _announce(port: int, device_id: str, url: str, token: str) -> None:
    """``device_id``'s presence on the broker, as an agent retains it; back once the service knows it."""
    from datetime import datetime, timezone

    import paho.mqtt.publish as publish

    presence = {"device_id": device_id, "online": True, "ts": datetime.now(timezone.utc).isoformat()}
    topic = f"edgesdk/devices/{device_id}/presence"
    publish.single(topic, json.dumps(presence), qos=1, retain=True, hostname="127.0.0.1", port=port)
    probe = Service(url, {"operator": token}, "", Path())
    deadline = time.monotonic() + 60
    while probe.call("GET", f"/api/v1/devices/{device_id}")[0] != 200:
        assert time.monotonic() < deadline, f"the service never learned {device_id}"
        time.sleep(0.2)


def _rollout(service: Service, **fields: Any) -> dict[str, Any]:
    return {"bundle_id": service.bundle_id, "devices": ["dev-1"], "canary": 0, "waves": [1.0], **fields}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("expires_s", 3e9),  # valid until 2121
        ("expires_s", 1e300),  # overflowed the command's date: a 500
        ("expires_s", 7 * 86400 + 1),
        ("probation_s", 1e300),
        ("wave_timeout_s", 1e300),
        ("p95_ms", 1e300),
        ("chunk_size", 10**30),
    ],
)
def test_a_rollout_with_an_absurd_number_is_a_422_naming_the_field(service: Service, field: str, value: Any) -> None:
    status, answer = service.call("POST", "/api/v1/deployments", _rollout(service, **{field: value}))
    assert status == 422, (status, answer)
    assert any(error["field"] == f"body.{field}" for error in answer["errors"]), answer  # RFC 9457 problem+json


def test_non_finite_numbers_are_a_422_and_a_week_is_accepted(service: Service) -> None:
    for field, literal in [("expires_s", "NaN"), ("probation_s", "Infinity"), ("waves", "[NaN]")]:
        body = json.dumps(_rollout(service)).replace("}", f', "{field}": {literal}}}').replace('"waves": [1.0], ', "")
        status, answer = service.call("POST", "/api/v1/deployments", raw=body.encode())
        assert status == 422, (field, status, answer)
    for action in ("abort", "rollback"):
        status, answer = service.call("POST", f"/api/v1/deployments/any/{action}", {"expires_s": 3e9})
        assert status == 422, (action, status, answer)
    status, created = service.call(
        "POST", "/api/v1/deployments", _rollout(service, expires_s=7 * 86400.0, deployment_id="a-week")
    )
    assert status == 201, created
    assert created["deployment_id"] == "a-week" and created["plan"]["command_ttl_s"] == 7 * 86400, created


def test_the_real_service_decommissions_a_device_and_answers_problems_and_healthz(service: Service) -> None:
    status, problem = service.call("GET", "/api/v1/devices?state=banana")
    assert status == 422 and problem["errors"][0]["field"] == "query.state", problem
    assert problem["status"] == 422 and problem["instance"] == "/api/v1/devices"
    status, ghost = service.call("POST", "/api/v1/deployments", _rollout(service, devices=["ghost-9"]))
    assert status == 422 and "'ghost-9'" in ghost["detail"], ghost
    with urllib.request.urlopen(service.url + "/healthz", timeout=10) as response:  # no token
        health = json.loads(response.read())
    assert response.status == 200 and health["status"] == "ok" and health["broker"]["connected"] is True, health
    assert service.call("DELETE", "/api/v1/devices/dev-2", role="operator")[0] == 403
    status, done = service.call("DELETE", "/api/v1/devices/dev-2", role="admin")
    assert status == 200 and done["broker_credentials_removed"] is True, done
    assert service.passwords.read_text().startswith("dev-1:") and "dev-2" not in service.passwords.read_text()
    assert service.call("GET", "/api/v1/devices/dev-2")[0] == 404


def test_schemathesis_finds_no_server_error_in_the_openapi_operations(service: Service, tmp_path: Path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    if st is None:
        pytest.skip("schemathesis is not installed (pip install '.[dev]'): the REST fuzz needs its st command")
    # A live rollout for the {deployment_id} operations (abort and rollback reach the controller), and the
    # uploaded bundle for POST /deployments: drawn in most cases, so the fuzz gets past the 404s.
    status, target = service.call("POST", "/api/v1/deployments", _rollout(service, deployment_id="fuzz-target"))
    assert status == 201, target
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        f"""
[dictionaries.bundles]
values = ["{service.bundle_id}"]
[dictionaries.deployments]
values = ["fuzz-target"]
[parameters]
"body.bundle_id" = {{ dictionary = "bundles", probability = 0.8 }}
"path.deployment_id" = {{ dictionary = "deployments", probability = 0.5 }}
"""
    )
    argv = [st, "--config-file", str(config), "run", f"{service.url}/openapi.json", "--checks", "not_a_server_error"]
    argv += ["--header", f"Authorization: Bearer {service.tokens['admin']}"]
    argv += ["--phases", "examples,coverage,fuzzing", "--max-examples", str(FUZZ_EXAMPLES)]
    argv += ["--max-time", str(FUZZ_SECONDS), "--seed", "37", "--workers", "1", "--request-timeout", "30"]
    argv += ["--suppress-health-check", "all", "--report", "ndjson", "--report-dir", str(tmp_path / "report")]
    started = time.monotonic()
    # In tmp_path: st keeps a .schemathesis cache in its working directory.
    run = subprocess.run(argv, capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, cwd=tmp_path)
    took = time.monotonic() - started
    summary = run.stdout[-6000:] + run.stderr[-2000:]
    errors = [line for line in service.log.read_text().splitlines() if re.match(r"[\w.]+(Error|Exception)\b", line)]
    assert run.returncode == 0, f"{summary}\n--- service errors ---\n" + "\n".join(errors[-20:])
    statuses = _response_statuses(tmp_path / "report")
    assert len(statuses) > 500, summary  # the run sent requests (not one that tested nothing)
    assert not [s for s in statuses if s >= 500], summary
    assert {201, 200, 422} <= set(statuses), sorted(set(statuses))  # it got past validation, and was refused
    print(f"schemathesis: {len(statuses)} requests in {took:.0f} s, statuses {sorted(set(statuses))}")


def _response_statuses(report_dir: Path) -> list[int]:
    """The status of every response in schemathesis' NDJSON report."""
    statuses = []
    for path in report_dir.glob("*.ndjson"):
        for line in path.read_text().splitlines():
            for match in re.finditer(r'"status_code":\s*(\d{3})', line):
                statuses.append(int(match.group(1)))
    return statuses
