"""The fleet service tells the truth about its broker (issue 40), through real processes: a real
``edgesdk fleet serve``, a real mosquitto and a real ``edge-agent run``.

Broker lost while running: ``edgesdk_fleet_broker_connected`` goes to 0, the log says so once
(WARNING), the dashboard shows a banner and the device as "unknown since HH:MM" (the database
says offline: mosquitto publishes the devices' Last Wills as it stops; yet not offline,
no offline alert, no ``device_up`` sample for Prometheus' offline rule). Broker back: the gauge
is 1 again, one INFO line gives the outage's length, the disconnect is counted, the device is
online. A start with the broker down waits for it (``--broker-wait``) and comes up when it
appears; with the wait spent, one error line and exit 1.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error
from tests.integration.test_fleet_web_and_enrollment_identity import cookie_value, cookies, fleet_serve, sign_in, token

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")

pytestmark = [pytest.mark.integration]

DEVICE = "dev-outage"


def _until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:g} s: {what}")


def _get(url: str, cookie: str | None = None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _fleet_devices(server: str, secret: str, tmp_path: Path) -> str:
    """``edgesdk fleet devices --server``'s table (wide: no column is cut)."""
    token_file = tmp_path / "viewer.token"
    token_file.write_text(secret)
    argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "devices", "--server", server]
    listed = subprocess.run(
        [*argv, "--token-file", str(token_file)], capture_output=True, text=True, timeout=60, env=_wide()
    )
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


def _wide() -> dict[str, str]:
    import os

    return {**os.environ, "COLUMNS": "250"}


def _stored_online(data: Path) -> list[tuple[str, int]]:
    import sqlite3

    with sqlite3.connect(str(data / "fleet-service.sqlite3")) as db:
        return db.execute("SELECT device_id, online FROM devices").fetchall()


def _agent(root: Path, broker_url: str):  # type: ignore[no-untyped-def]
    """A real agent (no model installed: presence is what matters here)."""
    from tests.agent_helpers import AgentProcess, make_device

    device = make_device(root)
    device.write_config(device_id=DEVICE, mqtt={"enabled": True, "broker": broker_url, "telemetry_interval_s": 3600})
    return AgentProcess(device).start()


def test_a_lost_broker_is_reported_and_devices_are_unknown_not_offline(mqtt_broker, tmp_path: Path) -> None:
    data = tmp_path / "data"
    viewer = token(data, "viewer")
    agent = _agent(tmp_path / "device", mqtt_broker.url)
    serve = ("--data-dir", str(data), "--metrics-listen", "127.0.0.1:0")
    try:
        with fleet_serve(tmp_path / "svc", ["--broker", mqtt_broker.url], *serve) as svc:
            log = tmp_path / "svc" / "serve.log"
            assert svc.metrics is not None
            metrics = lambda: _get(svc.metrics)[1]  # noqa: E731

            _until(lambda: 'edgesdk_fleet_devices{state="online"} 1.0' in metrics(), "the device online")
            assert "edgesdk_fleet_broker_connected 1.0" in metrics()
            signed = sign_in(svc.api, viewer)
            session = f"edgesdk_fleet_session={cookie_value(cookies(signed)['edgesdk_fleet_session'])}"

            mqtt_broker.stop()
            _until(lambda: "edgesdk_fleet_broker_connected 0.0" in metrics(), "the gauge at 0")
            # mosquitto publishes every device's Last Will as it goes down: the database says offline
            _until(lambda: _stored_online(data) == [(DEVICE, 0)], "the will stored", timeout=60)
            page = metrics()
            assert 'edgesdk_fleet_devices{state="unknown"} 1.0' in page, page
            assert f'edgesdk_fleet_device_up{{device="{DEVICE}"}}' not in page  # nothing for the offline rule
            status, overview = _get(svc.api + "/", session)
            assert status == 200 and 'id="broker-banner"' in overview, overview
            row = re.search(rf'<tr id="device-{DEVICE}">.*?</tr>', overview)
            assert row and re.search(r"unknown since \d\d:\d\d", row.group(0)), overview
            assert "is offline" not in overview  # no offline alert while the service cannot see
            assert 'id="broker-banner"' in _get(svc.api + f"/ui/devices/{DEVICE}", session)[1]
            health_status, health = _get(svc.api + "/healthz")
            assert health_status == 503 and '"connected":false' in health.replace(" ", ""), health
            listing = _fleet_devices(svc.api, viewer, tmp_path)
            assert re.search(rf"{DEVICE}\W+unknown since \d\d:\d\d", listing) and "presence unknown" in listing, listing
            lost = [line for line in log.read_text().splitlines() if "lost the broker" in line]
            assert len(lost) == 1 and "WARNING" in lost[0], log.read_text()[-2000:]

            mqtt_broker.start()
            _until(lambda: "edgesdk_fleet_broker_connected 1.0" in metrics(), "the gauge back at 1")
            _until(lambda: 'edgesdk_fleet_devices{state="online"} 1.0' in metrics(), "the device online again")
            assert "edgesdk_fleet_broker_disconnects_total 1.0" in metrics()
            back = [line for line in log.read_text().splitlines() if "is back after" in line]
            assert len(back) == 1 and "INFO" in back[0], log.read_text()[-2000:]
            outage = float(re.search(r"after a ([\d.]+) s outage", back[0]).group(1))  # type: ignore[union-attr]
            # The outage spans this test's steps above (a CLI run among them: seconds on a loaded
            # machine): a bound that tells a duration from a clock reading, not a pace.
            assert 0.0 < outage < 300.0, back[0]
            status, overview = _get(svc.api + "/", session)
            row = re.search(rf'<tr id="device-{DEVICE}">.*?</tr>', overview)
            assert row and ">online<" in row.group(0), overview
    finally:
        agent.stop()


def test_a_start_with_the_broker_down_waits_for_it_or_says_why_not(mqtt_broker, tmp_path: Path) -> None:
    mqtt_broker.stop()
    data = tmp_path / "data"
    from edgesdk.keys import generate_publisher_key

    operator_key, _ = generate_publisher_key(tmp_path / "operator")
    argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "serve", "--broker", mqtt_broker.url]
    argv += ["--data-dir", str(data), "--operator-key", str(operator_key)]
    gave_up = subprocess.run([*argv, "--broker-wait", "1s"], capture_output=True, text=True, timeout=60)
    # The service's log lines (timestamped) come first; then the one error line, exit 1.
    assert gave_up.returncode == 1 and "Traceback" not in gave_up.stderr, gave_up.stderr
    assert_one_line_error(
        subprocess.CompletedProcess(argv, 1, "", gave_up.stderr.strip().splitlines()[-1]),
        mqtt_broker.url,
        "within 1 s",
        "--broker-wait",
    )

    log = tmp_path / "svc" / "serve.log"

    def start_broker_once_the_service_waits() -> None:
        _until(lambda: log.exists() and "not reachable yet" in log.read_text(), "the service waiting", timeout=60)
        mqtt_broker.start()

    starter = threading.Thread(target=start_broker_once_the_service_waits, daemon=True)
    starter.start()
    with fleet_serve(
        tmp_path / "svc", ["--broker", mqtt_broker.url], "--data-dir", str(data), "--broker-wait", "60s"
    ) as svc:
        assert _get(svc.api + "/login")[0] == 200
        assert "still trying for" in log.read_text(), log.read_text()[-2000:]
    starter.join(5)
