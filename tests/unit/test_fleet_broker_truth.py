"""What the fleet service says while it cannot see its broker (issue 40), in-process: the
``BrokerWatch`` state machine and its log lines on a fake clock; the dashboard (TestClient over a
SQLite database with one device the database says is offline) with a banner, "unknown since"
presence and no offline alert while the broker is lost or presence is re-learned; the
zero-device hint; real 404s; and the ``/metrics`` page through promtool."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
pytest.importorskip("fastapi", reason="the fleet service API needs fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from edgesdk.fleet.service import tokens  # noqa: E402
from edgesdk.fleet.service.broker_watch import BrokerStatus, BrokerWatch, presence_label  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import Ingest  # noqa: E402
from edgesdk.fleet.service.metrics import FleetMetrics  # noqa: E402
from edgesdk.fleet.service.rest.app import ApiContext, create_app  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_broker_watch_logs_once_per_change_and_relearns_presence_after_an_outage(caplog) -> None:
    clock = Clock()
    watch = BrokerWatch("mqtt://b:1883", relearn_s=30.0, clock=clock)
    caplog.set_level(logging.INFO, logger="edgesdk.fleet.service.broker_watch")
    watch.connected()
    assert watch.status().connected and watch.status().disconnects == 0 and caplog.records == []
    clock.now += 100
    watch.lost("connection lost")
    watch.lost("again")  # the client may say so twice: one line
    lost = watch.status()
    assert not lost.connected and lost.disconnects == 1
    assert lost.since == datetime.fromtimestamp(clock.now, timezone.utc)
    assert presence_label(True, lost).startswith("unknown since ")  # not online, not offline
    assert presence_label(False, lost).startswith("unknown since ")
    clock.now += 42.5
    watch.connected()
    back = watch.status()
    assert back.connected and back.disconnects == 1
    assert [(r.levelname, "42.5 s outage" in r.getMessage()) for r in caplog.records] == [
        ("WARNING", False),
        ("INFO", True),
    ]
    during = datetime.fromtimestamp(clock.now + 10, timezone.utc)
    assert presence_label(True, back, during) == "online"  # a device that said so is online at once
    assert "re-learning" in presence_label(False, back, during)  # a stored offline may be stale
    assert presence_label(False, back, during + timedelta(seconds=30)) == "offline"
    assert BrokerStatus.from_dict(json.loads(json.dumps(back.as_dict()))) == back  # /healthz and back
    assert BrokerStatus.from_dict({"connected": None}) is None  # an API without a service around it


@pytest.fixture
def dashboard(tmp_path: Path):
    """The dashboard over a database where dev-1 is stored offline; ``watch`` drives the broker."""
    engine = open_engine(f"sqlite:///{tmp_path / 'truth.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    watch = BrokerWatch("mqtt://b:1883", relearn_s=30.0)
    context = ApiContext(engine=engine, store=store, commands=None, data_dir=tmp_path, broker_status=watch.status)  # type: ignore[arg-type]
    app = create_app(context)
    secret = tokens.create_token(engine, name="viewer", role="viewer", created_by="test")[1]
    with TestClient(app) as client:
        page = client.get("/login").text
        csrf = re.search(r'name=csrf value="([^"]+)"', page)
        assert csrf, page
        client.post("/login", data={"token": secret, "csrf": csrf.group(1)})
        yield client, engine, store, watch
    engine.dispose()


def _store_offline_device(engine, store) -> None:  # type: ignore[no-untyped-def]
    ingest = Ingest(engine, "edgesdk", store).start()
    now = datetime.now(timezone.utc).isoformat()
    online = {"device_id": "dev-1", "online": True, "ts": now, "groups": ["line-1"]}
    ingest.handle("edgesdk/devices/dev-1/presence", json.dumps(online).encode())
    ingest.handle("edgesdk/devices/dev-1/presence", json.dumps(online | {"online": False}).encode())
    assert ingest.drain(10)
    ingest.stop()


def test_dashboard_says_unknown_with_a_banner_while_the_broker_is_lost(dashboard) -> None:
    client, engine, store, watch = dashboard
    _store_offline_device(engine, store)
    watch.connected()
    page = client.get("/").text
    assert "broker-banner" not in page and "dev-1 is offline" in page  # the broker is up: the truth

    watch.lost("connection lost")
    page = client.get("/").text
    assert 'id="broker-banner"' in page and "lost its MQTT broker" in page
    row = re.search(r'<tr id="device-dev-1">.*?</tr>', page)
    assert row and re.search(r"unknown since \d\d:\d\d", row.group(0)), page
    assert "is offline" not in page and 'id="unknown">unknown<b>1' in page
    for path in ("/ui/devices/dev-1", "/login"):
        assert 'id="broker-banner"' in client.get(path).text, path

    watch.connected()  # back: presence is re-learned before dev-1 is called offline again
    page = client.get("/").text
    assert "re-learning" in page and "is offline" not in page


def test_dashboard_hints_at_enrollment_and_answers_404_for_what_does_not_exist(dashboard) -> None:
    client, _engine, _store, watch = dashboard
    watch.connected()
    page = client.get("/").text
    assert 'id="no-devices"' in page
    assert "edgesdk fleet enroll approve DEVICE_ID --server http://testserver" in page
    for path in ("/ui/devices/nobody", "/ui/deployments/nothing"):
        answer = client.get(path)
        assert answer.status_code == 404 and "back to the overview" in answer.text, path


def test_metrics_page_with_the_broker_lost_passes_promtool_and_has_no_device_up(dashboard) -> None:
    _client, engine, store, watch = dashboard
    _store_offline_device(engine, store)
    watch.connected()
    assert 'edgesdk_fleet_device_up{device="dev-1"} 0.0' in FleetMetrics(engine, broker_status=watch.status).render()
    watch.lost("connection lost")
    page = FleetMetrics(engine, broker_status=watch.status).render()
    assert "edgesdk_fleet_broker_connected 0.0" in page and "edgesdk_fleet_broker_disconnects_total 1.0" in page
    assert (
        'edgesdk_fleet_devices{state="unknown"} 1.0' in page and 'edgesdk_fleet_device_up{device="dev-1"}' not in page
    )
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian prometheus; scripts/test installs it)")
    checked = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_alerts_endpoint_raises_no_offline_alert_while_presence_is_unknown(dashboard) -> None:
    client, engine, store, watch = dashboard
    _store_offline_device(engine, store)
    secret = tokens.create_token(engine, name="reader", role="viewer", created_by="test")[1]

    def offline_alerts() -> list[str]:
        answer = client.get("/api/v1/alerts", headers={"Authorization": f"Bearer {secret}"})
        assert answer.status_code == 200, answer.text
        return [a["target"] for a in answer.json()["items"] if a["kind"] == "offline"]

    watch.connected()
    assert offline_alerts() == ["dev-1"]
    watch.lost("connection lost")
    assert offline_alerts() == []
    watch.connected()  # back, re-learning: still no offline alert for a stored offline
    assert offline_alerts() == []
