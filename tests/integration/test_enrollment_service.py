"""Enrollment through a real ``edgesdk fleet serve`` over a real mosquitto, driven by the real
``edgesdk fleet enroll --server`` CLI (issue 36 and issue 37, finding 1):

* a second announcement of a pending device with another key (an attacker on the shared
  bootstrap account) never replaces the key the device requested with: approving with the
  key id the device shows approves that key, a wrong or partial id is refused in one line;
* the service's registry is the one registry with ``--server``: no local file is touched;
* one key for two device ids is refused unless ``--allow-shared-key`` (then a warning);
* the service writes only under its data directory: with a temporary HOME, a ``--db``
  elsewhere, with and without ``--data-dir``, an uploaded bundle lands under the data dir
  (the directory of a SQLite ``--db`` by default) and HOME stays empty.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from edgesdk.agent.enrollment import enrollment_request

from edgesdk.keys import key_id
from tests.conftest import assert_one_line_error
from tests.mqtt_helpers import wait_acked

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")

pytestmark = [pytest.mark.integration]

EDGESDK = [sys.executable, "-m", "edgesdk.cli.main"]


def _kid(key: X25519PrivateKey) -> str:
    return key_id(key.public_key())


def announce(broker_url: str, device_id: str, key: X25519PrivateKey) -> None:
    """Publish a retained enroll request for ``device_id`` with ``key``, as the agent does."""
    from edgesdk.mqtt.client import ClientOptions, MqttClient

    client = MqttClient(ClientOptions(client_id=f"enroll-{device_id}-{time.monotonic_ns()}", broker_url=broker_url))
    client.start()
    assert client.wait_connected(60)
    request = enrollment_request(device_id, key.public_key().public_bytes_raw())
    client.publish(f"edgesdk/devices/{device_id}/enroll", request.model_dump_json().encode(), qos=1, retain=True)
    wait_acked(client)  # the QoS 1 acknowledgement before the disconnect
    client.stop()


class Serve:
    """``edgesdk fleet serve --api`` with its own HOME; ``.url`` of its API, ``.log`` of its stderr."""

    def __init__(self, root: Path, broker_url: str, operator_key: Path, *extra: str) -> None:
        self.home = root / "home"
        self.home.mkdir(parents=True)
        self.env = {**os.environ, "HOME": str(self.home)}
        for name in ("EDGESDK_FLEET_SERVICE_DB", "EDGESDK_FLEET_SERVER", "EDGESDK_FLEET_TOKEN"):
            self.env.pop(name, None)
        self.argv = [*EDGESDK, "fleet", "serve", "--broker", broker_url, "--operator-key", str(operator_key)]
        self.argv += ["--api", "127.0.0.1:0", *extra]
        self.log = root / "serve.log"

    def token(self, role: str, db_url: str, path: Path) -> Path:
        made = subprocess.run(
            [*EDGESDK, "fleet", "serve", "token", "create", "--role", role, "--name", role, "--db", db_url],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
        )
        assert made.returncode == 0, made.stderr
        path.write_text(made.stdout.strip() + "\n")
        return path

    @contextmanager
    def running(self) -> Iterator[str]:
        with open(self.log, "w") as log:
            proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log, text=True, env=self.env)
            try:
                assert proc.stdout is not None
                banner = proc.stdout.readline()
                found = re.search(r"API on (http://\S+)", banner)
                assert found, banner + self.log.read_text()[-2000:]
                self.banner = banner
                yield found.group(1)
            finally:
                proc.terminate()
                proc.wait(60)


def _enroll(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESDK_FLEET", "EDGESDK_ENROLLMENT"))}
    return subprocess.run(
        [*EDGESDK, "fleet", "enroll", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def _wait_for(check, what: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_approval_through_the_service_is_bound_to_the_key_the_device_shows(mqtt_broker, tmp_path: Path) -> None:
    from edgesdk.keys import generate_publisher_key

    operator_key, _ = generate_publisher_key(tmp_path / "operator")
    data_dir, db_dir, cwd = tmp_path / "data", tmp_path / "db", tmp_path / "cwd"
    cwd.mkdir()
    db_url = f"sqlite:///{db_dir / 'fleet.sqlite3'}"
    serve = Serve(tmp_path / "svc", mqtt_broker.url, operator_key, "--db", db_url, "--data-dir", str(data_dir))
    operator = serve.token("operator", db_url, tmp_path / "operator.token")
    device, attacker, cam_b = X25519PrivateKey.generate(), X25519PrivateKey.generate(), X25519PrivateKey.generate()

    announce(mqtt_broker.url, "cam-a", device)
    with serve.running() as url:
        as_operator = ("--server", url, "--token-file", str(operator))

        def listed() -> dict[str, dict]:
            proc = _enroll("list", "--json", *as_operator, cwd=cwd)
            assert proc.returncode == 0, proc.stderr
            return {row["device_id"]: row for row in json.loads(proc.stdout)}

        _wait_for(lambda: "cam-a" in listed(), "the service to record cam-a's request")
        # Between the operator's look at the device and the approval, someone announces cam-a
        # again with their own key (the bootstrap account may write any device's enroll topic).
        announce(mqtt_broker.url, "cam-a", attacker)
        _wait_for(lambda: listed()["cam-a"]["offered_key_id"] == _kid(attacker), "the second key to be recorded")
        assert listed()["cam-a"]["key_id"] == _kid(device)
        table = _enroll("list", *as_operator, cwd=cwd)
        assert "other key offered" in table.stdout and _kid(attacker) in table.stdout, table.stdout

        assert_one_line_error(_enroll("approve", "cam-a", *as_operator, cwd=cwd), "--key-id")
        prefix = _enroll("approve", "cam-a", *as_operator, "--key-id", _kid(device)[:12], cwd=cwd)
        assert_one_line_error(prefix, "32 hex digits")
        stranger = X25519PrivateKey.generate()
        wrong = _enroll("approve", "cam-a", *as_operator, "--key-id", _kid(stranger), cwd=cwd)
        assert_one_line_error(wrong, "409", _kid(device), _kid(stranger))
        local = _enroll("approve", "cam-a", *as_operator, "--key-id", _kid(device), "--registry", "r.json", cwd=cwd)
        assert_one_line_error(local, "--registry", "--server")

        approved = _enroll("approve", "cam-a", *as_operator, "--key-id", _kid(device), "--json", cwd=cwd)
        assert approved.returncode == 0, approved.stderr
        assert json.loads(approved.stdout)["key_id"] == _kid(device)
        registry = json.loads((data_dir / "enrollment.json").read_text())
        assert registry["devices"]["cam-a"]["key_id"] == _kid(device)  # never the attacker's
        assert listed()["cam-a"]["status"] == "approved"
        # The attacker's key stays a flagged request: approving it needs replace, and still its full id.
        rekey = _enroll("approve", "cam-a", *as_operator, "--key-id", _kid(attacker), cwd=cwd)
        assert_one_line_error(rekey, "409", "--replace")

        # Packaging takes its recipients from the same registry: the approved key only.
        from tests.bundle_helpers import write_convert_dir

        convert = write_convert_dir(tmp_path / "convert", {"fp32": {"model.onnx": b"not a real model" * 8}})
        package = [*EDGESDK, "package", str(convert), "--version", "1.0.0", "--publisher-key", str(operator_key)]
        package += ["--out", str(tmp_path / "m.edgepkg"), "--recipients-from-server", *as_operator, "--json"]
        packaged = subprocess.run(package, capture_output=True, text=True, timeout=120, cwd=cwd)
        assert packaged.returncode == 0, packaged.stderr
        assert json.loads(packaged.stdout)["recipients"] == [_kid(device)]

        # One key for two devices: refused, unless allowed on purpose (then a warning, and a log line).
        announce(mqtt_broker.url, "cam-b", device)
        announce(mqtt_broker.url, "cam-c", cam_b)
        _wait_for(lambda: {"cam-b", "cam-c"} <= set(listed()), "cam-b and cam-c")
        shared = _enroll("approve", "cam-b", *as_operator, "--key-id", _kid(device), cwd=cwd)
        assert_one_line_error(shared, "409", "'cam-a'", "--allow-shared-key")
        allowed = _enroll(
            "approve", "cam-b", *as_operator, "--key-id", _kid(device), "--allow-shared-key", cwd=cwd
        )  # fmt: skip
        assert allowed.returncode == 0, allowed.stderr
        assert allowed.stderr.startswith("warning: ") and "also approved for cam-a" in allowed.stderr
        assert "also approved for cam-a" in serve.log.read_text()

    assert list(cwd.iterdir()) == []  # --server never wrote a local registry (nor anything else here)
    assert f"data in {data_dir}" in serve.banner
    assert [p for p in serve.home.rglob("*")] == []


def test_the_service_writes_under_the_directory_of_its_sqlite_db_not_home(mqtt_broker, tmp_path: Path) -> None:
    from tests.bundle_helpers import make_keys, placeholder_bundle

    keys = make_keys(tmp_path / "keys")
    bundle = placeholder_bundle(tmp_path, keys)
    db_dir = tmp_path / "elsewhere"
    db_url = f"sqlite:///{db_dir / 'fleet.sqlite3'}"
    serve = Serve(tmp_path / "svc", mqtt_broker.url, keys.publisher_key, "--db", db_url)  # no --data-dir
    operator = serve.token("operator", db_url, tmp_path / "operator.token").read_text().strip()
    with serve.running() as url:
        request = urllib.request.Request(
            f"{url}/api/v1/bundles?filename=digits.edgepkg",
            data=bundle.read_bytes(),
            method="POST",
            headers={"Authorization": f"Bearer {operator}", "Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            uploaded = json.loads(response.read())
    assert "path" not in uploaded  # the answer never shows a server path (issue 40)
    assert (db_dir / "bundles" / f"{uploaded['sha256']}.edgepkg").is_file()
    assert f"data in {db_dir}" in serve.banner
    assert [p for p in serve.home.rglob("*")] == []
