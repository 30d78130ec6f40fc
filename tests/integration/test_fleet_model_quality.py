"""Drift and data-quality figures (issue 41) through the real fleet service: a real mosquitto, the
service process (``tests/fleet_service_process.py``, the ``FleetService`` that ``fleet serve``
runs) on SQLite and on a throwaway PostgreSQL cluster, and telemetry messages with ``quality``
published to the broker as an agent publishes them. They are stored once each (a redelivery
adds nothing), read back by ``GET /api/v1/devices/{id}/quality`` (a viewer's token; none or a
forged one: 401), exported on ``/metrics``, raised as the dashboard's alerts with their figure,
pruned with raw telemetry, and drawn on the device page in Debian's Chromium.

The device ``dev-q`` reports every 2 minutes over the last 14: its input ``x`` has drifted
(PSI 0.42) for 12 minutes, and 5 of its 100 requests a report carry NaN; ``dev-ok`` stays near
its reference. ``dev-s`` drifts the same way but its traffic is sparse: some of its reports
score no tensor, one only the output, its newest none, and its run goes on through them. Its last three reports carry a probation's shadow agreement falling under the
deployment's minimum 0.95 (``AGREEMENT``): stored, served, exported, charted on the device page
and shown in its row of a rollout page while it is in probation.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("fastapi", reason="needs the fleet-service extra")
pytest.importorskip("paho.mqtt", reason="needs paho-mqtt")

import sqlalchemy as sa  # noqa: E402

from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker  # noqa: E402
from edgesdk.mqtt.client import ClientOptions, MqttClient  # noqa: E402
from tests.integration.conftest import require_mosquitto  # noqa: E402
from tests.pg_helpers import throwaway_cluster  # noqa: E402

pytestmark = [pytest.mark.integration]

MODEL = {"name": "digits", "version": "1.2.0", "release": 12, "variant": "onnx-fp32", "sha256": "b" * 64}
#: dev-q's shadow agreement in its reports 5, 6 and 7: (figure, lower bound, samples).
AGREEMENT = {5: (0.97, 0.90, 60), 6: (0.93, 0.87, 120), 7: (0.90, 0.85, 180)}
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-sync"]


#: dev-s's reports that score no tensor (too few values in their window), and the one that scores
#: its output only.
UNSCORED, OUTPUT_ONLY = {2, 3, 7}, 5


def _report(device: str, seq: int, ts: datetime, psi: float, nonfinite: int) -> bytes:
    """A telemetry message as the agent sends it: the default model's quality at the top level
    and in ``models`` (the same figures: stored once). The output has no KS (class shares)."""
    inputs = {"x": {"psi": psi, "js": 0.3, "ks": round(psi / 2, 2)}}
    outputs = {"probs": {"psi": 0.03, "js": 0.05}}
    if device == "dev-s" and seq in UNSCORED | {OUTPUT_ONLY}:
        inputs = {}
        outputs = {} if seq in UNSCORED else outputs
    quality = {
        "samples": 100,
        "window_s": 120.0,
        "reference": True,
        "inputs": inputs,
        "outputs": outputs,
        "nonfinite": nonfinite,
        "out_of_range": 1,
        "constant": 0,
    }
    if device == "dev-q" and seq in AGREEMENT:
        value, lower, samples = AGREEMENT[seq]
        figure = {"kind": "top1", "value": value, "lower_bound": lower, "samples": samples, "minimum": 0.95}
        quality["agreement"] = {"probs": figure}
    body = {
        "device_id": device,
        "msg_id": f"{device}-q{seq}",
        "seq": seq,
        "ts": ts.isoformat(),
        "model": MODEL,
        "quality": quality,
        "models": [{"model": MODEL, "quality": quality}],
    }
    return json.dumps(body).encode()


@dataclass
class Service:
    url: str
    db_url: str
    viewer: str
    operator: str
    started: datetime  # the reports' clock
    devices: MqttClient  # publishes as the devices do

    def call(self, method: str, path: str, body: bytes | None, kind: str = "application/json") -> tuple[int, Any]:
        """An operator's REST call; (status, JSON answer)."""
        headers = {"Authorization": f"Bearer {self.operator}", "Content-Type": kind}
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def get(self, path: str, token: str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read()
                return response.status, body.decode() if path == "/metrics" else json.loads(body)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")


def _publish_reports(devices: MqttClient, now: datetime) -> None:
    for seq in range(8):  # every 2 minutes, the oldest 14 minutes ago
        ts = now - timedelta(minutes=14 - 2 * seq)
        drifted = seq >= 1  # 12 minutes over PSI 0.25 by the newest report
        report = _report("dev-q", seq, ts, 0.42 if drifted else 0.04, 5)
        devices.publish("edgesdk/devices/dev-q/telemetry", report, qos=1)
        devices.publish("edgesdk/devices/dev-ok/telemetry", _report("dev-ok", seq, ts, 0.05, 0), qos=1)
        devices.publish(
            "edgesdk/devices/dev-s/telemetry", _report("dev-s", seq, ts, 0.42 if drifted else 0.04, 0), qos=1
        )
    devices.publish("edgesdk/devices/dev-q/telemetry", report, qos=1)  # the newest again: a redelivery


def _start(db_url: str, root: Path) -> Iterator[Service]:
    """The service on ``db_url`` with a broker of its own (the service's MQTT client id is the
    same for every service of a namespace: two on one broker would take each other's session)."""
    from edgesdk.fleet.service.database import migrate, open_engine
    from edgesdk.fleet.service.tokens import create_token
    from edgesdk.keys import generate_publisher_key

    require_mosquitto()
    engine = open_engine(db_url)
    migrate(engine)
    viewer = create_token(engine, name="vera", role="viewer", created_by="test")[1]
    operator = create_token(engine, name="otto", role="operator", created_by="test")[1]
    engine.dispose()
    key, _ = generate_publisher_key(root / "operator")
    with MosquittoBroker(data_dir=root / "mosquitto") as broker:
        argv = [sys.executable, "-m", "tests.fleet_service_process", "--db", db_url, "--broker", broker.url]
        argv += ["--operator-key", str(key), "--api", "127.0.0.1:0", "--data-dir", str(root)]
        with open(root / "service.log", "w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        devices = MqttClient(ClientOptions(client_id="quality-test-devices", broker_url=broker.url))
        try:
            port_file = root / "api.port"
            deadline = time.monotonic() + 60
            while not port_file.exists() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            assert port_file.exists(), (root / "service.log").read_text()[-3000:]
            devices.start()
            assert devices.wait_connected(60), devices.stats.last_error
            url = f"http://127.0.0.1:{port_file.read_text()}"
            service = Service(url, db_url, viewer, operator, datetime.now(UTC), devices)
            _publish_reports(devices, service.started)
            if not _known(service, "dev-q", within_s=10):
                # Published before the service's subscription took: once more, stored once all the same.
                _publish_reports(devices, service.started)
            yield service
        finally:
            devices.stop()
            proc.terminate()
            proc.wait(30)


def _known(service: Service, device: str, *, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while service.get(f"/api/v1/devices/{device}", service.viewer)[0] != 200:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def sqlite_service(tmp_path_factory: Any) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("quality-sqlite")
    yield from _start(f"sqlite:///{root / 'fleet.sqlite3'}", root)


@pytest.fixture(scope="module")
def postgresql_service(tmp_path_factory: Any) -> Iterator[Service]:
    with throwaway_cluster() as cluster:
        root = tmp_path_factory.mktemp("quality-postgresql")
        yield from _start(cluster.create_database("fleet_quality"), root)


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request: Any) -> Service:
    return request.getfixturevalue(f"{request.param}_service")


def _reports(service: Service, device: str, query: str = "", count: int = 8) -> list[dict[str, Any]]:
    """The device's reports once ``count`` of them are stored (the ingest is asynchronous)."""
    deadline = time.monotonic() + 60
    while True:
        status, body = service.get(f"/api/v1/devices/{device}/quality{query}", service.viewer)
        if status == 200 and len(body["reports"]) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 200, body
    return body["reports"]


def test_quality_reports_are_stored_once_and_read_back_per_model_and_time(service: Service) -> None:
    reports = _reports(service, "dev-q")
    assert len(reports) == 8  # one row per report: the top level and models[0] are the same figures
    newest = reports[-1]
    assert newest["model"] == "digits" and newest["release"] == 12 and newest["reference"] is True
    assert newest["inputs"] == {"x": {"psi": 0.42, "js": 0.3, "ks": 0.21}}
    assert newest["outputs"] == {"probs": {"psi": 0.03, "js": 0.05, "ks": None}}
    assert (newest["samples"], newest["nonfinite"], newest["out_of_range"], newest["constant"]) == (100, 5, 1, 0)
    figure = {"kind": "top1", "value": 0.9, "lower_bound": 0.85, "samples": 180, "minimum": 0.95}
    assert newest["agreement"] == {"probs": figure} and reports[0]["agreement"] is None  # no shadow ran then
    assert [r["ts"] for r in reports] == sorted(r["ts"] for r in reports)
    recent = service.started.timestamp() - 5 * 60
    assert len(_reports(service, "dev-q", f"?since={recent}", count=0)) == 3  # 4, 2 and 0 minutes ago
    assert _reports(service, "dev-q", "?model=other", count=0) == []
    status, _ = service.get("/api/v1/devices/nobody/quality", service.viewer)
    assert status == 404


def test_quality_reads_refuse_a_missing_or_forged_token(service: Service) -> None:
    _reports(service, "dev-q")
    assert service.get("/api/v1/devices/dev-q/quality")[0] == 401
    forged = service.viewer[:-4] + ("AAAA" if not service.viewer.endswith("AAAA") else "BBBB")
    assert service.get("/api/v1/devices/dev-q/quality", forged)[0] == 401


def test_drift_and_quality_counts_are_exported_and_raised_as_alerts_with_their_figure(service: Service) -> None:
    _reports(service, "dev-q")
    _reports(service, "dev-ok")
    status, page = service.get("/metrics", service.viewer)
    assert status == 200
    labels = 'device="dev-q",model="digits"'
    assert f'edgesdk_fleet_model_drift_psi{{{labels},tensor="x",direction="input"}} 0.42' in page
    assert f'edgesdk_fleet_model_drift_psi{{{labels},tensor="probs",direction="output"}} 0.03' in page
    # 8 reports of 100 sampled and 5 NaN each; the redelivered one is not counted twice.
    assert f'edgesdk_fleet_model_requests_total{{{labels},kind="sampled"}} 800.0' in page
    assert f'edgesdk_fleet_model_requests_total{{{labels},kind="nonfinite"}} 40.0' in page
    agreement = f'edgesdk_fleet_model_shadow_agreement{{{labels},output="probs"'
    assert f'{agreement},bound="value"}} 0.9' in page and f'{agreement},bound="lower"}} 0.85' in page
    assert f'{agreement},bound="minimum"}} 0.95' in page
    assert 'edgesdk_fleet_model_shadow_agreement{device="dev-ok"' not in page  # no shadow: no figure
    status, alerts = service.get("/api/v1/alerts", service.viewer)
    assert status == 200
    mine = {(a["kind"], a["target"]): a for a in alerts["items"]}
    drift = mine[("model_drift", "dev-q")]
    assert "PSI 0.42 on input x" in drift["message"], drift
    assert drift["since"] == pytest.approx((service.started - timedelta(minutes=12)).timestamp(), abs=1)
    nonfinite = mine[("model_nonfinite", "dev-q")]
    assert "4.8% of requests refused for NaN/Inf" in nonfinite["message"], nonfinite  # 25 of 525 in 10 min
    assert not [k for k in mine if k[1] == "dev-ok"], mine  # PSI 0.05, no NaN: quiet
    assert ("model_out_of_range", "dev-q") not in mine  # 1 %: under 5 %
    assert f'edgesdk_fleet_model_drift_ks{{{labels},tensor="x",direction="input"}} 0.21' in page
    assert 'edgesdk_fleet_model_drift_ks{device="dev-q",model="digits",tensor="probs"' not in page  # none sent


def test_a_sparse_devices_unscored_reports_keep_its_drift_series_and_its_alerts_run(service: Service) -> None:
    """dev-s's newest report scores nothing and an earlier one only its output: /metrics keeps
    each tensor's newest score, and its drift alert runs from its first drifted report (12 min)."""
    reports = _reports(service, "dev-s")
    assert [bool(r["inputs"]) for r in reports] == [True, True, False, False, True, False, True, False]
    status, page = service.get("/metrics", service.viewer)
    assert status == 200
    labels = 'device="dev-s",model="digits"'
    assert f'edgesdk_fleet_model_drift_psi{{{labels},tensor="x",direction="input"}} 0.42' in page  # 2 min old
    assert f'edgesdk_fleet_model_drift_psi{{{labels},tensor="probs",direction="output"}} 0.03' in page
    assert f'edgesdk_fleet_model_drift_ks{{{labels},tensor="x",direction="input"}} 0.21' in page
    status, alerts = service.get("/api/v1/alerts", service.viewer)
    assert status == 200
    [drift] = [a for a in alerts["items"] if (a["kind"], a["target"]) == ("model_drift", "dev-s")]
    assert "PSI 0.42 on input x" in drift["message"], drift
    assert drift["since"] == pytest.approx((service.started - timedelta(minutes=12)).timestamp(), abs=1)


def test_the_device_page_draws_drift_per_tensor_and_the_quality_counts(sqlite_service: Service) -> None:
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev extra)")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).is_file():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    _reports(sqlite_service, "dev-q")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(20_000)
            page.goto(sqlite_service.url + "/")
            page.fill("#token", sqlite_service.operator)
            with page.expect_navigation():
                page.click("#sign-in")
            page.goto(sqlite_service.url + "/ui/devices/dev-q")
            section = page.locator("#model-quality .quality[data-model=digits]")
            drift, ks, counts = (section.locator("figure").nth(i) for i in range(3))
            assert "digits: drift per tensor (PSI)" in drift.inner_text()
            assert "digits: drift per tensor (KS)" in ks.inner_text() and "input x 0.21 KS" in ks.inner_text()
            assert ks.locator("polyline").count() == 1  # the output sent no KS
            assert len((ks.locator("polyline").get_attribute("points") or "").split()) == 8
            assert "input x 0.42 PSI" in drift.inner_text() and "output probs 0.03 PSI" in drift.inner_text()
            assert drift.locator("polyline").count() == 2 and drift.locator("line.threshold").count() == 1
            points = drift.locator("polyline").first.get_attribute("points") or ""
            assert len(points.split()) == 8, points  # one point per report
            box = drift.locator("svg").bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 100  # drawn, not collapsed
            assert "NaN/Inf refused 5 requests" in counts.inner_text()
            agreement = section.locator("figure").nth(3)
            assert "digits: shadow agreement with the previous release (agreement)" in agreement.inner_text()
            assert "probs top1 0.9 agreement" in agreement.inner_text()
            assert "probs lower bound 0.85 agreement" in agreement.inner_text()
            assert agreement.locator("polyline").count() == 2 and agreement.locator("line.threshold").count() == 1
            points = agreement.locator("polyline").first.get_attribute("points") or ""
            assert len(points.split()) == 3, points  # the three reports made while the shadow ran
            _the_rollout_row_shows_agreement_in_probation(sqlite_service, page)
            page.goto(sqlite_service.url + "/ui/alerts")
            alert = page.locator("#alerts li[data-kind=model_drift]").filter(has_text="dev-q")
            assert "PSI 0.42 on input x" in alert.inner_text()
            assert alert.locator("a").get_attribute("href") == "/ui/devices/dev-q"
        finally:
            browser.close()


def _the_rollout_row_shows_agreement_in_probation(service: Service, page: Any) -> None:
    """A real rollout to dev-q, its status PROBATION as the agent reports it: dev-q's row on the
    rollout page shows its newest agreement figure against the minimum."""
    from edgesdk.schemas.messages import OtaStatus
    from tests.bundle_helpers import make_keys, placeholder_bundle

    root = Path(service.db_url.removeprefix("sqlite:///")).parent
    bundle = placeholder_bundle(root / "rollout", make_keys(root / "rollout-keys"))
    status, stored = service.call("POST", "/api/v1/bundles", bundle.read_bytes(), "application/octet-stream")
    assert status in (200, 201), stored
    plan = {"bundle_id": stored["id"], "devices": ["dev-q"], "deployment_id": "q-rollout", "canary": 0}
    status, made = service.call("POST", "/api/v1/deployments", json.dumps(plan | {"probation_s": 900}).encode())
    assert status == 201, made
    held: list[Any] = []
    try:
        # The state lands after the page is drawn and before its event stream takes its baseline
        # (the stream's request is held meanwhile): no change event can tell the page, only the
        # 'live' event the stream sends once it watches (a gap the old page never filled).
        page.route("**/ui/events", lambda route: held.append(route))
        page.goto(service.url + "/ui/deployments/q-rollout")
        deadline = time.monotonic() + 60
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        assert held, "the page opened no event stream"
        report = OtaStatus(
            device_id="dev-q", deployment_id="q-rollout", msg_id="q-p", ts=datetime.now(UTC), state="PROBATION"
        )
        service.devices.publish("edgesdk/devices/dev-q/ota/status", report.model_dump_json().encode(), qos=1)
        while time.monotonic() < deadline and _rollout_state(service, "q-rollout", "dev-q") != "PROBATION":
            time.sleep(0.1)
        assert page.locator("#dd-dev-q .agreement").count() == 0  # drawn before the state came
        # The streams share one snapshot up to 0.9 s old (dashboard_live.SharedSnapshot): older
        # than the state, the baseline would differ and send a change. Past that, it holds it.
        time.sleep(2.0)
        held.pop().continue_()
        page.unroute("**/ui/events")
        row = page.locator("#dd-dev-q .agreement")
        row.wait_for(timeout=60_000)
        assert row.inner_text() == "shadow agreement 0.900 on probs (top1), lower bound 0.850 < 0.95 over 180 requests"
    finally:
        service.call("POST", "/api/v1/deployments/q-rollout/abort", json.dumps({"reason": "test over"}).encode())


def _rollout_state(service: Service, deployment_id: str, device_id: str) -> str | None:
    status, detail = service.call("GET", f"/api/v1/deployments/{deployment_id}", None)
    assert status == 200, detail
    return next((d["state"] for d in detail["device_states"] if d["device_id"] == device_id), None)


def test_quality_rows_are_pruned_with_raw_telemetry_and_the_totals_stay(service: Service) -> None:
    from edgesdk.fleet.service.database import open_engine
    from edgesdk.fleet.service.retention import Retention, prune

    # Last in the file: it deletes half of the reports the tests above read.

    _reports(service, "dev-q")
    _reports(service, "dev-ok")
    _reports(service, "dev-s")
    engine = open_engine(service.db_url)
    try:
        cutoff_age = (datetime.now(UTC) - service.started).total_seconds() + 7 * 60  # older than 7 min
        deleted = prune(engine, Retention(raw_retention_s=cutoff_age), time.time())
        assert deleted["model_quality"] == 12  # 4 reports of each device: 14, 12, 10, 8 minutes old
        with engine.connect() as db:
            left = db.execute(sa.select(sa.func.count()).select_from(schema.model_quality)).scalar()
            totals = db.execute(sa.select(schema.model_quality_totals.c.samples)).scalars().all()
        assert left == 12 and sorted(totals) == [800, 800, 800]
    finally:
        engine.dispose()
