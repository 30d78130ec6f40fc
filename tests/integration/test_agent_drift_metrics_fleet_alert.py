"""A drifted input stream from a real agent to the fleet's drift alert (issue 41), through real
processes: ``edge-agent run`` serving digits with its signed reference profile, reporting every
second over a real mosquitto to the fleet service process (``tests/fleet_service_process.py``, the
``FleetService`` of ``fleet serve``) on SQLite.

A steady stream of calibration-like requests turns into pixels x3. The first report scoring the
image over PSI 0.25 is stored within one telemetry interval or so of the switch (measured here);
the dashboard's alert is not raised yet, and its condition read from the rows that real service
stored (``quality_alerts``, what ``GET /api/v1/alerts`` calls) fires exactly ``DRIFT_FOR_S``
(10 minutes) after that report while the drifted stream goes on: the number docs/fleet-service.md
states. A pause in the traffic of three telemetry intervals does not restart the 10 minutes (the
agent reports nothing for a model that answered nothing; an empty report used to end the run). Waiting the 10 minutes themselves is left to the alert's own tests with dated reports."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.agent_helpers import AgentProcess, make_device
from tests.integration.test_agent_drift_metrics import _profiled_convert_dir

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")
httpx = pytest.importorskip("httpx")

pytestmark = [pytest.mark.integration]

INTERVAL_S = 1.0  # the agent's telemetry interval


class _Service:
    """The fleet service process on a SQLite file, its REST API read with a viewer's token."""

    def __init__(self, root: Path, broker_url: str) -> None:
        from edgesdk.fleet.service.database import migrate, open_engine
        from edgesdk.fleet.service.tokens import create_token
        from edgesdk.keys import generate_publisher_key

        self.db_url = f"sqlite:///{root / 'fleet.sqlite3'}"
        engine = open_engine(self.db_url)
        migrate(engine)
        self.viewer = create_token(engine, name="vera", role="viewer", created_by="test")[1]
        engine.dispose()
        key, _ = generate_publisher_key(root / "operator")
        argv = [sys.executable, "-m", "tests.fleet_service_process", "--db", self.db_url, "--broker", broker_url]
        argv += ["--operator-key", str(key), "--api", "127.0.0.1:0", "--data-dir", str(root)]
        self.log = root / "service.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        port_file, deadline = root / "api.port", time.monotonic() + 60
        while not port_file.exists() and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        assert port_file.exists(), self.log.read_text()[-3000:]
        self.url = f"http://127.0.0.1:{port_file.read_text()}"

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.viewer}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError:
            return None

    def first_report(
        self, psi_over: float | None = None, psi_under: float | None = None, after: float = 0.0
    ) -> dict[str, Any]:
        """The oldest stored report of dev-1's digits (made after ``after``) whose image PSI is
        over or under the figure, once there is one (the ingest is asynchronous)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            body = self.get("/api/v1/devices/dev-1/quality?model=digits") or {"reports": []}
            for report in (r for r in body["reports"] if r["ts"] > after):
                psi = report["inputs"].get("image", {}).get("psi")
                if psi is not None and (psi > psi_over if psi_over is not None else psi < psi_under):
                    return report
            time.sleep(0.2)
        raise AssertionError(f"no such report in 60 s: {body['reports'][-5:]}\n{self.log.read_text()[-3000:]}")

    def wait_for_telemetry_made_after(self, ts: float) -> None:
        """Until dev-1's newest stored telemetry message was made (its ``ts``) after ``ts``."""
        deadline = time.monotonic() + 60
        while ((self.get("/api/v1/devices/dev-1") or {}).get("latest") or {}).get("ts", 0) < ts:
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class _Stream:
    """Requests at a steady pace on a thread, from ``images`` times ``scale`` (changed on the fly)."""

    def __init__(self, url: str, images: np.ndarray) -> None:
        self.url, self.images, self.scale = url, images, 1.0
        self.paused = False
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.wait(0.02):
                if self.paused:
                    continue
                image = self.images[self.sent % len(self.images)] * self.scale
                client.post(
                    "/v1/models/digits/infer",
                    content=np.ascontiguousarray(image[None], dtype="<f4").tobytes(),
                    headers={"Content-Type": "application/x-edgesdk-tensors", "X-Tensors": "image=float32[1,1,8,8]"},
                )
                self.sent += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


@pytest.fixture
def fleet(mqtt_broker: Any, tmp_path: Path) -> Iterator[_Service]:
    (tmp_path / "fleet").mkdir()
    service = _Service(tmp_path / "fleet", mqtt_broker.url)
    yield service
    service.stop()


def test_a_real_agents_drifted_stream_is_stored_at_once_and_alerts_ten_minutes_after_its_first_report(
    digits: Any, request: pytest.FixtureRequest, mqtt_broker: Any, fleet: _Service, tmp_path: Path
) -> None:
    import sqlalchemy as sa

    from edgesdk.fleet.service.quality import DRIFT_FOR_S, quality_alerts

    device = make_device(tmp_path / "device")
    device.write_config(mqtt={"enabled": True, "broker": mqtt_broker.url, "telemetry_interval_s": INTERVAL_S})
    device.install(_profiled_convert_dir(digits, request, tmp_path), name="digits")
    images = np.load(digits.calibration)["image"][:128].astype(np.float32)
    with AgentProcess(device) as agent:
        stream = _Stream(agent.url, images)
        try:
            fleet.first_report(psi_under=0.1)  # the calm stream, stored
            switched = time.time()
            stream.scale = 3.0
            first = fleet.first_report(psi_over=0.25)
            stored_s = time.time() - switched
            stream.paused = True  # a pause in the drifted traffic: two reports made after it began
            fleet.wait_for_telemetry_made_after(time.time() + 2 * INTERVAL_S + 0.2)
            stream.paused = False
            fleet.first_report(psi_over=0.25, after=time.time())  # the drift goes on after it
            alerts = fleet.get("/api/v1/alerts")["items"]
            assert not [a for a in alerts if a["kind"] == "model_drift"], alerts  # seconds old: not yet

            engine = sa.create_engine(fleet.db_url)
            with engine.connect() as db:

                def drift_alerts(at: float) -> list[Any]:
                    return [a for a in quality_alerts(db, at) if a.kind == "model_drift" and a.device_id == "dev-1"]

                assert drift_alerts(first["ts"] + DRIFT_FOR_S - 1) == []
                (alert,) = drift_alerts(first["ts"] + DRIFT_FOR_S)
            engine.dispose()
        finally:
            stream.stop()
    assert alert.since == pytest.approx(first["ts"]) and alert.figure > 0.25, alert
    print(
        f"first drifted report stored {stored_s:.1f} s after the switch (interval {INTERVAL_S} s), {stream.sent} requests"
    )
