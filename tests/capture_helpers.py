"""What the capture upload tests share (issue 41): a device with the digits model and upload on,
the fleet service process on SQLite, sealed capture files as the agent's writer leaves them, the
uploader's ledger read from outside, and waiting for a condition.

Used by tests/integration/test_capture_upload.py, test_capture_chunks_upload.py and
test_capture_upload_across_restart.py; import it after their ``pytest.importorskip`` lines (the
service needs the fleet-service extra)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.capture.upload import CHUNK_BYTES
from edgesdk.mqtt.broker import MosquittoBroker
from tests.agent_helpers import Device, make_device

#: The device passwords of the shipped-broker ACL tests.
DEVICE_PASSWORDS = {"rpi-001": "pw-of-rpi-001", "rpi-002": "pw-of-rpi-002"}
#: A device's capture acknowledgements (service → that device).
ACK_TOPIC = "edgesdk/devices/{}/capture/ack"
#: What the uploader writes down of each chunk it handed to the outbox (agent/capture/upload.py).
LEDGER = ".uploaded"


def get(url: str, token: str) -> tuple[int, bytes]:
    """GET ``url`` with a bearer token; (status, body), an HTTP error included."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def until(check: Any, timeout: float = 60.0) -> Any:
    """``check()``'s first truthy answer, or its last answer once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def start_service(root: Path, broker: MosquittoBroker) -> tuple[subprocess.Popen[str], str, str, str, str]:
    """The service process on SQLite; (process, API url, viewer token, operator token, db url)."""
    from edgesdk.fleet.service.database import migrate, open_engine
    from edgesdk.fleet.service.tokens import create_token
    from edgesdk.keys import generate_publisher_key

    db_url = f"sqlite:///{root / 'fleet.sqlite3'}"
    engine = open_engine(db_url)
    migrate(engine)
    viewer = create_token(engine, name="vera", role="viewer", created_by="test")[1]
    operator = create_token(engine, name="otto", role="operator", created_by="test")[1]
    engine.dispose()
    key, _ = generate_publisher_key(root / "publisher")
    argv = [sys.executable, "-m", "tests.fleet_service_process", "--db", db_url, "--broker", broker.url]
    argv += ["--operator-key", str(key), "--api", "127.0.0.1:0", "--data-dir", str(root)]
    with open(root / "service.log", "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
    port_file = root / "api.port"
    until(lambda: port_file.exists() or proc.poll() is not None, 60)
    assert port_file.exists(), (root / "service.log").read_text()[-3000:]
    return proc, f"http://127.0.0.1:{port_file.read_text()}", viewer, operator, db_url


def ingest_counters(db_url: str) -> dict[str, int]:
    """The service's ingest counters as stored in its database."""
    from edgesdk.fleet.service.database import open_engine
    from edgesdk.fleet.service.ingest import read_counters

    engine = open_engine(db_url)
    try:
        return read_counters(engine, "test")
    finally:
        engine.dispose()


def listed_captures(url: str, viewer: str, device_id: str = "dev-1") -> list[dict[str, Any]]:
    """The captures the service lists for ``device_id`` (none while it does not answer 200)."""
    import json

    status, body = get(f"{url}/api/v1/devices/{device_id}/captures", viewer)
    return json.loads(body)["captures"] if status == 200 else []


def digits_device(digits: Any, root: Path, request: Any) -> tuple[Device, Path, Path]:
    """A device with the digits model installed and an operator capture key pair;
    (device, operator private key, operator public key)."""
    from edgesdk.capture.operator_key import generate_capture_key
    from tests.bundle_helpers import make_digits_convert_dir

    cache = Path(request.config.cache.mkdir("edgesdk-agent-digits-fp32-convert-v1"))
    convert_dir = make_digits_convert_dir(digits, cache / "out", int8=False)
    operator_private, operator_public = generate_capture_key(root / "operator")
    device = make_device(root / "device")
    device.install(convert_dir, name="digits")
    return device, operator_private, operator_public


def upload_config(device: Device, broker: MosquittoBroker, operator_public: Path) -> None:
    """The device captures every answer and uploads its files through ``broker``."""
    device.write_config(
        mqtt={"enabled": True, "broker": broker.url, "telemetry_interval_s": 3600},
        capture={"rate": 1.0, "operator_public_key": str(operator_public), "upload": True},
    )


def put_capture(directory: Path, second: int, operator_public: Path) -> tuple[Path, np.ndarray]:
    """A sealed ~3 MB capture record (six chunks) as the agent's writer leaves one (a temporary
    dot-file, renamed); (its path, the input it holds)."""
    from edgesdk.capture.record import pack_record
    from edgesdk.capture.sealed import seal
    from edgesdk.keys import load_device_public_key

    image = np.frombuffer(os.urandom(3 * 1024 * 1024), dtype=np.float32).reshape(-1, 1024)
    sealed = seal(pack_record({"image": image}, {}, {"model": "digits"}), load_device_public_key(operator_public))
    assert len(sealed) > 5 * CHUNK_BYTES  # six chunks
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"20261206T0000{second:02d}.000000Z-{second:06d}-digits.edgecap"
    temporary = directory / f".{path.name}.tmp"
    temporary.write_bytes(sealed)
    temporary.rename(path)
    return path, image


def ledger_entries(ledger: Path) -> list[tuple[str, str, int, int]]:
    """The uploader's ledger, line by line: (file name, sha256, chunk index, chunk count)."""
    try:
        lines = ledger.read_text().split("\n")
    except FileNotFoundError:
        return []
    fields = [line.split() for line in lines]
    return [(f[0], f[1], int(f[2]), int(f[3])) for f in fields if len(f) == 4]


def fully_queued(ledger: Path, name: str) -> bool:
    """The uploader's ledger says the last chunk of ``name`` is in the outbox."""
    return any(n == name and index == count - 1 for n, _, index, count in ledger_entries(ledger))
