"""The fleet service as a real process over a real mosquitto, with three real agent processes:
a rollout (canary, then a wave) and a failing canary (abort, roll back), each run once without
interruption and once with the service SIGKILLed at every step and restarted — the killed run
must end exactly as the uninterrupted one, with no device updated twice and none forgotten.
The same cases run on SQLite and on a throwaway PostgreSQL cluster (skipped, visibly, when
the server binaries are missing). The ingest runs on the same processes: presence, telemetry
and OTA history land in the database; a malformed payload and a device speaking for another
are counted and ignored."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
pytest.importorskip("onnxruntime")
pytest.importorskip("paho.mqtt")

from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES  # noqa: E402
from edgesdk.fleet.rollout import RolloutPlan  # noqa: E402
from edgesdk.fleet.service import schema  # noqa: E402
from edgesdk.fleet.service.database import migrate, open_engine  # noqa: E402
from edgesdk.fleet.service.ingest import read_counters  # noqa: E402
from edgesdk.fleet.service.store import SqlRolloutStore  # noqa: E402
from edgesdk.fleet.service.submit import submit_deployment  # noqa: E402
from edgesdk.mqtt.broker import MosquittoBroker, find_mosquitto  # noqa: E402
from tests.agent_helpers import AgentProcess, run_agent_cli  # noqa: E402
from tests.ota_helpers import OtaBundles, build_ota_bundles, make_mqtt_device  # noqa: E402
from tests.pg_helpers import throwaway_cluster  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DEVICES = ["dev-0", "dev-1", "dev-2"]
SERVICE = [sys.executable, "-m", "tests.fleet_service_process"]
_releases = itertools.count(10)  # every rollout installs a release above the last


class Fleet:
    """mosquitto, three agents on release 1, and the bundles."""

    def __init__(self, root: Path, bundles: OtaBundles) -> None:
        if find_mosquitto() is None:
            pytest.skip("mosquitto is not installed (apt-get install mosquitto; scripts/test installs it)")
        self.root = root
        self.bundles = bundles
        self.broker = MosquittoBroker(data_dir=root / "mosquitto")
        self.broker.start()
        self.agents: dict[str, AgentProcess] = {}
        for device_id in DEVICES:
            mqtt = {"enabled": True, "broker": self.broker.url, "telemetry_interval_s": 2.0, "groups": ["line-1"]}
            device = make_mqtt_device(root / device_id, bundles, self.broker.url, device_id=device_id, mqtt=mqtt)
            installed = run_agent_cli("install", "--config", str(device.config), str(bundles.v1))
            assert installed.returncode == 0, installed.stderr
            self.agents[device_id] = AgentProcess(device).start()

    def bundle(self, *, bad: bool) -> Path:
        from edgesdk.bundle import package_bundle

        release = next(_releases)
        source = self.bundles.v3_bad_golden.parent / ("convert-bad-golden" if bad else "convert")
        return package_bundle(
            source,
            name="digits",
            version=f"1.{release}.0",
            release=release,
            publisher_key=self.bundles.keys.publisher_key,
            recipients=[self.bundles.keys.device_pub],
            out=self.root / f"r{release}{'-bad' if bad else ''}.edgepkg",
        )

    def releases(self) -> dict[str, int]:
        found = {}
        for device_id, agent in self.agents.items():
            with urllib.request.urlopen(agent.url + "/v1/status", timeout=10) as response:
                found[device_id] = json.loads(response.read())["model"]["release"]
        return found

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        self.broker.stop()


@pytest.fixture(scope="module")
def fleet(digits, tmp_path_factory) -> Any:
    bundles = build_ota_bundles(digits, tmp_path_factory.mktemp("fleet-service-bundles"))
    fleet = Fleet(tmp_path_factory.mktemp("fleet-service"), bundles)
    yield fleet
    fleet.stop()


@pytest.fixture(scope="module")
def postgres() -> Any:
    with throwaway_cluster() as cluster:
        yield cluster


_databases = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fleet-service.sqlite3'}"
    return request.getfixturevalue("postgres").create_database(f"fleet_{next(_databases)}")


class Service:
    """Starts ``tests/fleet_service_process.py`` runs against one database."""

    def __init__(self, fleet: Fleet, db_url: str, log_dir: Path) -> None:
        self.fleet = fleet
        self.db_url = db_url
        self.log_dir = log_dir
        self.runs = 0

    def _argv(self, kill_at: str | None) -> list[str]:
        argv = [*SERVICE, "--db", self.db_url, "--broker", self.fleet.broker.url]
        argv += ["--operator-key", str(self.fleet.bundles.operator_key), "--data-dir", str(self.log_dir)]
        argv += ["--api", "127.0.0.1:0"] if self.api else []
        return argv + (["--kill-at", kill_at] if kill_at else [])

    api = False

    def api_url(self, timeout: float = 60) -> str:
        port_file = self.log_dir / "api.port"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not port_file.exists():
            time.sleep(0.05)
        return f"http://127.0.0.1:{port_file.read_text()}"

    def start(self, kill_at: str | None = None) -> tuple[subprocess.Popen[str], Path]:
        self.runs += 1
        log = self.log_dir / f"service-{self.runs}-{kill_at or 'clean'}.log"
        (self.log_dir / "api.port").unlink(missing_ok=True)
        handle = open(log, "w")  # noqa: SIM115 - the child owns it
        return subprocess.Popen(self._argv(kill_at), stdout=handle, stderr=subprocess.STDOUT, text=True), log

    def run_until_killed(self, kill_at: str) -> None:
        proc, log = self.start(kill_at)
        try:
            rc = proc.wait(180)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"the service never reached step {kill_at}:\n{log.read_text()[-3000:]}") from None
        text = log.read_text()
        assert rc == -9 and f"KILLED AT {kill_at}" in text, f"rc {rc}, expected a kill at {kill_at}:\n{text[-3000:]}"


def _final(store: SqlRolloutStore, deployment_id: str) -> bool:
    row = store.get(deployment_id)
    if row.state not in FINISHED_ROLLOUT_STATES:
        return False
    owed = store.pending_follow_ups(deployment_id)
    # Every device that was sent something has its final word (a rollback confirmation included).
    busy = [d for d in store.devices(deployment_id) if d.state not in ("PENDING", "COMMITTED", "FAILED", "ROLLED_BACK")]
    return not owed and not busy


def run_rollout(fleet: Fleet, db_url: str, log_dir: Path, *, bad: bool, kill_steps: list[str]) -> dict[str, Any]:
    """Submit one rollout, kill the service at each of ``kill_steps``, then let it finish; the
    end state in a form comparable across runs (wave positions, not device names)."""
    engine = open_engine(db_url)
    migrate(engine)
    store = SqlRolloutStore(engine)
    before = fleet.releases()
    bundle = fleet.bundle(bad=bad)
    plan = RolloutPlan(canary=0.33, waves=(1.0,), max_failures=0.0, probation_s=6.0, wave_timeout_s=150, resend_s=5)
    message = submit_deployment(store, bundle, plan, devices=DEVICES)
    deployment_id = message.deployment_id
    log_dir.mkdir(parents=True, exist_ok=True)
    service = Service(fleet, db_url, log_dir)
    for step in kill_steps:
        service.run_until_killed(step)
    proc, log = service.start()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not _final(store, deployment_id):
            time.sleep(0.3)
        assert _final(store, deployment_id), f"not finished: {store.summary(deployment_id)}\n{log.read_text()[-3000:]}"
    finally:
        proc.terminate()
        proc.wait(30)
    after = fleet.releases()
    rows = store.devices(deployment_id)
    with engine.connect() as db:
        history = db.execute(
            schema.ota_history.select()
            .where(schema.ota_history.c.deployment_id == deployment_id)
            .order_by(schema.ota_history.c.ts)
        ).all()
    # No device updated twice: its reported states, with repeats collapsed, never go back.
    for device in rows:
        states = [h.state for h in history if h.device_id == device.device_id]
        collapsed = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]
        assert len(collapsed) == len(set(collapsed)), f"{device.device_id} went through {collapsed}"
        if device.state != "PENDING":
            assert collapsed, f"{device.device_id}: no status history"
    summary = store.summary(deployment_id)
    engine.dispose()
    return {
        "state": summary["state"],
        "waves": {wave: sorted(d.state for d in rows if d.wave == int(wave)) for wave in summary["waves"]},
        "moved": sorted(
            "new" if after[d] == message.release else ("old" if after[d] == before[d] else f"?{after[d]}")
            for d in DEVICES
        ),
        "reason_kind": summary["reason"].split(" ")[1:5] if summary["state"] == "ABORTED" else summary["reason"],
    }


SCENARIOS = {
    # canary (1 device) then a wave of 2; the service killed before and after each wave starts,
    # during each probation, and between the canary passing and the next wave being stored.
    "rollout": (
        False,
        ["wave_started:0", "wave_sent:0", "probation:0", "wave_done:0", "wave_started:1", "probation:1"],
    ),
    # the canary fails its smoke test: killed after the wave is sent and after the failure decision.
    "failed-canary": (True, ["wave_sent:0", "abort_decided:0"]),
}
_baselines: dict[str, dict[str, Any]] = {}


def baseline(fleet: Fleet, tmp_path_factory: Any, scenario: str) -> dict[str, Any]:
    """The uninterrupted run of ``scenario`` (once per module, on SQLite)."""
    if scenario not in _baselines:
        root = tmp_path_factory.mktemp(f"baseline-{scenario}")
        bad, _ = SCENARIOS[scenario]
        _baselines[scenario] = run_rollout(fleet, f"sqlite:///{root / 'db.sqlite3'}", root, bad=bad, kill_steps=[])
    return _baselines[scenario]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_service_killed_at_every_step_ends_like_an_uninterrupted_run(
    fleet: Fleet, db_url: str, tmp_path: Path, tmp_path_factory: Any, scenario: str
) -> None:
    expected = baseline(fleet, tmp_path_factory, scenario)
    bad, steps = SCENARIOS[scenario]
    if bad:
        assert expected["state"] == "ABORTED" and expected["moved"] == ["old"] * 3, expected
    else:
        assert expected["state"] == "SUCCEEDED" and expected["moved"] == ["new"] * 3, expected
    killed = run_rollout(fleet, db_url, tmp_path / "logs", bad=bad, kill_steps=steps)
    assert killed == expected


def test_ingest_of_real_devices_and_refused_payloads(fleet: Fleet, db_url: str, tmp_path: Path) -> None:
    from edgesdk.mqtt.client import ClientOptions, MqttClient

    engine = open_engine(db_url)
    migrate(engine)
    service = Service(fleet, db_url, tmp_path)
    proc, log = service.start()
    intruder = MqttClient(ClientOptions(client_id="intruder", broker_url=fleet.broker.url, clean_start=True))
    intruder.start()
    try:
        assert intruder.wait_connected(60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with engine.connect() as db:
                devices = db.execute(schema.devices.select()).all()
                telemetry = db.execute(schema.telemetry.select()).all()
            learned = all(d.online and json.loads(d.groups) == ["line-1"] and d.model_sha256 for d in devices)
            if len(devices) == 3 and learned and {t.device_id for t in telemetry} == set(DEVICES):
                break  # what is asserted below: a row can be stored before all its fields are
            time.sleep(0.3)
        assert sorted(d.device_id for d in devices) == DEVICES, log.read_text()[-2000:]
        assert all(d.online and json.loads(d.groups) == ["line-1"] and d.model_sha256 for d in devices)
        assert {t.device_id for t in telemetry} == set(DEVICES)
        # dev-0's topic, but a telemetry report for dev-1; then bytes that are not JSON.
        spoof = telemetry[-1]._mapping
        fake = {
            "device_id": "dev-1" if spoof["device_id"] != "dev-1" else "dev-2",
            "msg_id": "spoofed",
            "seq": 10**9,
            "ts": "2026-01-01T00:00:00Z",
        }
        intruder.publish("edgesdk/devices/dev-0/telemetry", json.dumps(fake).encode(), qos=1)
        intruder.publish("edgesdk/devices/dev-0/events", b"\xff not json", qos=1)
        deadline = time.monotonic() + 60
        counters: dict[str, int] = {}
        while time.monotonic() < deadline:
            counters = read_counters(engine, "db")
            if counters.get("impersonating", 0) >= 1 and counters.get("malformed", 0) >= 1:
                break
            time.sleep(0.3)
        assert counters.get("impersonating") == 1 and counters.get("malformed") == 1, counters
        with engine.connect() as db:
            assert not db.execute(schema.telemetry.select().where(schema.telemetry.c.msg_id == "spoofed")).all()
        assert proc.poll() is None  # still serving
    finally:
        intruder.stop()
        proc.terminate()
        proc.wait(30)
        engine.dispose()


def test_submit_cli_and_its_bad_input(tmp_path: Path, edgesdk_cli, digits, tmp_path_factory) -> None:
    from tests.conftest import assert_one_line_error

    bundles = build_ota_bundles(digits, tmp_path_factory.mktemp("submit-bundles"))
    db = f"sqlite:///{tmp_path / 'svc.sqlite3'}"
    ok = edgesdk_cli("fleet", "submit", str(bundles.v2), "--db", db, "--devices", "a,b,c", "--canary", "33%", "--json")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["state"] == "PENDING" and report["devices"] == 3 and list(report["waves"]) == ["0", "1", "2"]
    bad_db = edgesdk_cli("fleet", "submit", str(bundles.v2), "--db", "mysql://x/y", "--devices", "a")
    assert_one_line_error(bad_db, "'mysql://x/y'")
    no_group = edgesdk_cli("fleet", "submit", str(bundles.v2), "--db", db, "--group", "nobody-here")
    assert_one_line_error(no_group, "'nobody-here'")
    both = edgesdk_cli("fleet", "submit", str(bundles.v2), "--db", db, "--group", "g", "--devices", "a")
    assert_one_line_error(both, "exactly one of --group")
    bad_retention = edgesdk_cli(
        "fleet", "serve", "--broker", "mqtt://127.0.0.1:9", "--db", db, "--raw-retention", "forever"
    )
    assert_one_line_error(bad_retention, "--raw-retention", "'forever'")


def _call(url: str, token: str, method: str = "GET", body: Any = None, raw: bytes | None = None) -> Any:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {"Authorization": f"Bearer {token}"}
    if raw is not None:
        headers["Content-Type"] = "application/octet-stream"
    elif body is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_api_upload_push_watch_rollback_and_refusals(fleet: Fleet, db_url: str, tmp_path: Path, edgesdk_cli) -> None:
    import urllib.error

    tokens = {}
    for role in ("viewer", "operator"):
        made = edgesdk_cli(
            "fleet", "serve", "token", "create", "--role", role, "--name", f"{role}-1", "--db", db_url, "--json"
        )
        assert made.returncode == 0, made.stderr
        tokens[role] = json.loads(made.stdout)["token"]
    service = Service(fleet, db_url, tmp_path)
    service.api = True
    proc, log = service.start()
    try:
        base = service.api_url() + "/api/v1"
        before = fleet.releases()
        deadline = time.monotonic() + 60  # the ingest learns the devices and their group
        while time.monotonic() < deadline:
            known = _call(f"{base}/devices?group=line-1&state=online", tokens["viewer"])
            if known["total"] == 3:
                break
            time.sleep(0.3)
        assert known["total"] == 3, log.read_text()[-2000:]
        bundle = fleet.bundle(bad=False)
        with pytest.raises(urllib.error.HTTPError) as refused:
            _call(f"{base}/bundles?filename={bundle.name}", tokens["viewer"], "POST", raw=bundle.read_bytes())
        assert refused.value.code == 403
        uploaded = _call(f"{base}/bundles?filename={bundle.name}", tokens["operator"], "POST", raw=bundle.read_bytes())
        plan = {"bundle_id": uploaded["id"], "group": "line-1", "canary": 0.33, "waves": [1.0], "max_failures": 0.0}
        created = _call(f"{base}/deployments", tokens["operator"], "POST", {**plan, "probation_s": 2.0})
        deployment_id = created["deployment_id"]
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            report = _call(f"{base}/deployments/{deployment_id}", tokens["viewer"])
            if report["state"] in FINISHED_ROLLOUT_STATES:
                break
            time.sleep(0.5)
        assert report["state"] == "SUCCEEDED", report
        assert set(fleet.releases().values()) == {uploaded["model_release"]}
        assert {e["state"] for e in report["timeline"]} >= {"COMMITTED"}
        committed = _call(f"{base}/devices?version={uploaded['model_version']}", tokens["viewer"])
        deadline = time.monotonic() + 60  # presence/telemetry report the new model
        while committed["total"] < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
            committed = _call(f"{base}/devices?version={uploaded['model_version']}", tokens["viewer"])
        assert committed["total"] == 3
        scrape = urllib.request.Request(
            service.api_url() + "/metrics", headers={"Authorization": f"Bearer {tokens['viewer']}"}
        )
        with urllib.request.urlopen(scrape, timeout=30) as response:  # a viewer token (or --metrics-listen)
            page = response.read().decode()
        assert f'edgesdk_fleet_rollout_info{{deployment="{deployment_id}",state="SUCCEEDED"}} 1.0' in page
        assert 'edgesdk_fleet_devices{state="online"} 3.0' in page
        assert f'edgesdk_fleet_rollout_devices{{deployment="{deployment_id}",state="COMMITTED"}} 3.0' in page

        rolled = _call(f"{base}/deployments/{deployment_id}/rollback", tokens["operator"], "POST", {"reason": "test"})
        assert rolled["asked"] == 3 and rolled["state"] == "ROLLED_BACK"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and fleet.releases() != before:
            time.sleep(0.5)
        assert fleet.releases() == before
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(
                urllib.request.Request(f"{base}/deployments/{deployment_id}/abort", data=b"", method="POST")
            )
        assert anonymous.value.code == 401
    finally:
        proc.terminate()
        proc.wait(30)


def test_cli_through_the_service(fleet: Fleet, tmp_path: Path, edgesdk_cli) -> None:
    from tests.conftest import assert_one_line_error

    db_url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    token_files = {}
    for role in ("viewer", "operator"):
        made = edgesdk_cli("fleet", "serve", "token", "create", "--role", role, "--name", f"cli-{role}", "--db", db_url)
        assert made.returncode == 0, made.stderr
        token_files[role] = tmp_path / f"{role}.token"
        token_files[role].write_text(made.stdout.strip() + "\n")
    service = Service(fleet, db_url, tmp_path)
    service.api = True
    proc, log = service.start()
    try:
        server = service.api_url()
        as_operator = ["--server", server, "--token-file", str(token_files["operator"])]
        as_viewer = ["--server", server, "--token-file", str(token_files["viewer"])]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listing = edgesdk_cli("fleet", "devices", "--group", "line-1", "--json", *as_viewer)
            assert listing.returncode == 0, listing.stderr
            if json.loads(listing.stdout)["total"] == 3:
                break
            time.sleep(0.5)
        table = edgesdk_cli("fleet", "devices", *as_viewer)
        assert "3 device(s), 3 online" in table.stdout, table.stdout + table.stderr
        before = fleet.releases()
        bundle = fleet.bundle(bad=False)
        push = edgesdk_cli(
            "fleet", "push", str(bundle), "--devices", ",".join(DEVICES), "--canary", "0%", "--waves", "100%",
            "--probation", "1s", "--max-failures", "0%", "--deployment-id", "cli-svc-1", *as_operator,
        )  # fmt: skip
        assert push.returncode == 0, push.stderr + push.stdout + log.read_text()[-2000:]
        assert "SUCCEEDED" in push.stdout
        status = edgesdk_cli("fleet", "status", "cli-svc-1", "--json", *as_viewer)
        assert json.loads(status.stdout)["by_state"] == {"COMMITTED": 3}
        assert "cli-svc-1" in edgesdk_cli("fleet", "status", *as_viewer).stdout
        refused = edgesdk_cli("fleet", "rollback", "cli-svc-1", *as_viewer)
        assert_one_line_error(refused, "403", "operator role")
        assert_one_line_error(edgesdk_cli("fleet", "abort", "nope", *as_operator), "404", "'nope'")
        rollback = edgesdk_cli("fleet", "rollback", "cli-svc-1", "--wait", "90s", "--json", *as_operator)
        assert rollback.returncode == 0, rollback.stderr
        assert fleet.releases() == before
        enrolled = edgesdk_cli("fleet", "enroll", "list", "--json", *as_viewer)
        assert sorted(r["device_id"] for r in json.loads(enrolled.stdout)) == DEVICES
        from edgesdk.keys import key_id, load_device_public_key

        device_key_id = key_id(load_device_public_key(fleet.bundles.keys.device_pub))  # what `edge-agent key` shows
        approve = ("fleet", "enroll", "approve", "dev-0", "--key-id", device_key_id, "--json")
        approved = edgesdk_cli(*approve, *as_operator)
        assert approved.returncode == 0 and json.loads(approved.stdout)["status"] == "approved", approved.stderr
        assert_one_line_error(edgesdk_cli("fleet", "enroll", "revoke", "dev-0", *as_operator), "admin role")
        unreachable = edgesdk_cli(
            "fleet", "status", "--server", "http://127.0.0.1:9", "--token-file", str(token_files["viewer"])
        )
        assert_one_line_error(unreachable, "127.0.0.1:9")
    finally:
        proc.terminate()
        proc.wait(30)


def test_dashboard_in_a_real_browser(fleet: Fleet, tmp_path: Path, edgesdk_cli) -> None:
    """Debian's chromium driven by Playwright (never ``playwright install``): sign in, see the
    devices, upload a bundle and start a rollout, watch it finish, roll it back with the button,
    then see a canary that fails its probation roll back. Screenshots of each page go to the
    test's directory, or to docs/images/ with EDGESDK_UPDATE_SCREENSHOTS=1 (how the docs' were made)."""
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev extra)")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).is_file():
        pytest.skip("Debian's chromium is not installed (scripts/test installs it)")
    import os

    docs_images = Path(__file__).resolve().parents[2] / "docs" / "images"
    images = docs_images if os.environ.get("EDGESDK_UPDATE_SCREENSHOTS") == "1" else tmp_path / "screenshots"
    images.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{tmp_path / 'ui.sqlite3'}"
    made = edgesdk_cli("fleet", "serve", "token", "create", "--role", "operator", "--name", "ana", "--db", db_url)
    assert made.returncode == 0, made.stderr
    service = Service(fleet, db_url, tmp_path)
    service.api = True
    proc, log = service.start()
    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    try:
        base = service.api_url()
        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=args)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(base + "/")
            assert page.url.endswith("/login")
            page.fill("#token", made.stdout.strip())
            page.click("#sign-in")
            for device_id in DEVICES:  # the page reloads itself until the ingest has them
                page.wait_for_selector(f"#device-{device_id}", timeout=90_000)
            # Locator waits, not wait_for_function: the page's CSP refuses eval, which that uses.
            page.locator("#devices .ok").nth(2).wait_for(timeout=90_000)
            page.screenshot(path=str(images / "fleet-overview.png"), full_page=True)

            def start_rollout(bundle: Path, **fields: str) -> None:
                page.goto(base + "/")
                page.set_input_files("#bundle-file", str(bundle))
                with page.expect_navigation():
                    page.click("#upload")
                page.select_option("#bundle", label=page.locator("#bundle option", has_text=bundle.name).inner_text())
                page.fill("#target", "line-1")
                for name, value in {"canary": "33%", "waves": "100%", "max_failures": "0%", **fields}.items():
                    page.fill(f"input[name={name}]", value)
                with page.expect_navigation():
                    page.click("#start-rollout")
                assert "/ui/deployments/" in page.url, page.inner_text("main")

            def wait_state(state: str) -> None:
                page.locator(f"#rollout-state span:text-is('{state}')").wait_for(timeout=180_000)

            before = fleet.releases()
            good = fleet.bundle(bad=False)
            start_rollout(good, probation_s="2")
            wait_state("SUCCEEDED")
            assert set(fleet.releases().values()) == {int(good.stem[1:])}
            page.screenshot(path=str(images / "fleet-rollout.png"), full_page=True)
            with page.expect_navigation():
                page.click("#rollback")
            wait_state("ROLLED_BACK")
            page.locator(".wave .state .bad").nth(2).wait_for(timeout=120_000)
            assert page.locator(".wave .state .bad").count() == 3
            assert fleet.releases() == before

            page.goto(f"{base}/ui/devices/dev-0")
            page.wait_for_selector("svg")
            page.screenshot(path=str(images / "fleet-device.png"), full_page=True)

            slow = fleet.bundle(bad=False)
            start_rollout(slow, probation_s="20", p95_ms="0.0001")  # no model is this fast: probation fails
            wait_state("ABORTED")
            page.locator(".wave .state span:text-is('ROLLED_BACK')").first.wait_for(timeout=120_000)
            reasons = " ".join(page.locator(".wave .reason").all_inner_texts())
            assert "p95 latency" in reasons, reasons
            assert "failed in waves 0..0" in page.inner_text("#rollout-reason")
            page.screenshot(path=str(images / "fleet-rollout-failed.png"), full_page=True)
            assert fleet.releases() == before  # the canary rolled back, the others were never sent
            browser.close()
        assert all((images / f"fleet-{name}.png").stat().st_size > 10_000 for name in ("overview", "rollout", "device"))
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.returncode not in (0, -15):
            print(log.read_text()[-3000:])


def test_the_real_serve_command_starts_answers_and_stops_cleanly(fleet: Fleet, tmp_path: Path) -> None:
    import signal
    import socket

    from tests.conftest import assert_one_line_error

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "edgesdk.cli.main", "fleet", "serve", "--broker", fleet.broker.url]
    argv += ["--db", f"sqlite:///{tmp_path / 's.sqlite3'}", "--operator-key", str(fleet.bundles.operator_key)]
    argv += ["--data-dir", str(tmp_path), "--namespace", "edgesdk-cli-test"]
    bad = subprocess.run([*argv, "--api", "localhost:http"], capture_output=True, text=True, timeout=60)
    assert_one_line_error(bad, "--api", "'localhost:http'")
    proc = subprocess.Popen(
        [*argv, "--api", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert f"API on http://127.0.0.1:{port}" in banner, banner + (proc.stderr.read() if proc.poll() else "")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=10) as response:
            assert response.status == 200 and b"Operator token" in response.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0  # a clean stop: rollouts stay IN_PROGRESS for the next start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_deployment_list_pages_in_the_database_newest_first_on_sqlite_and_postgresql(
    postgres: Any, tmp_path: Path
) -> None:
    """``GET /api/v1/deployments`` over more deployments than a page: the pages, walked with
    ``offset``, hold every deployment once, newest first (ties in ``created`` in a fixed order),
    with the total; the database pages (every read of the deployments' rows is LIMITed), on both
    dialects."""
    for url in (f"sqlite:///{tmp_path / 'pages.sqlite3'}", postgres.create_database("fleet_pages")):
        pages = _DeploymentPages(url, tmp_path)
        newest_first = ["dep-6", "dep-5", "dep-4", "dep-3", "dep-2", "dep-1", "dep-0"]
        assert pages.walk("") == (newest_first, {7}), url
        assert pages.walk("&state=ABORTED") == (["dep-5", "dep-2"], {2}), url
        listing = [s for s in pages.reads if "FROM deployments" in s and "ORDER BY" in s]
        assert listing and all("LIMIT" in s for s in listing), (url, listing)
        pages.engine.dispose()


class _DeploymentPages:
    """Seven deployments (two ABORTED, ties in ``created``) behind the REST app, and every SQL
    statement the app sends."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        import sqlalchemy as sa
        from fastapi.testclient import TestClient

        from edgesdk.fleet.service import tokens
        from edgesdk.fleet.service.rest.app import ApiContext, create_app
        from tests.unit.test_fleet_service_store import _template

        self.engine = open_engine(url)
        migrate(self.engine)
        store = SqlRolloutStore(self.engine)
        table = schema.deployments
        for n, ts in enumerate([100.0, 101.0, 101.0, 102.0, 103.0, 103.0, 103.0]):  # ties: the id orders them
            store.create(_template(f"dep-{n}"), tmp_path / "b.edgepkg", {}, [["a"]])
            with self.engine.begin() as db:
                db.execute(table.update().where(table.c.id == f"dep-{n}").values(created=ts))
        store.set_state("dep-2", "ABORTED", reason="test")
        store.set_state("dep-5", "ABORTED", reason="test")
        _, token = tokens.create_token(self.engine, name="pager", role="viewer", created_by="test")
        self.headers = {"Authorization": f"Bearer {token}"}
        context = ApiContext(engine=self.engine, store=store, commands=None, data_dir=tmp_path)  # type: ignore[arg-type]
        self.client = TestClient(create_app(context))
        self.reads: list[str] = []
        sa.event.listen(self.engine, "before_cursor_execute", lambda *args: self.reads.append(args[2]))

    def walk(self, query: str) -> tuple[list[str], set[int]]:
        """The ids on the pages of three (offset 0, 3, 6) and the totals they gave."""
        ids, totals = [], set()
        for offset in range(0, 9, 3):
            answer = self.client.get(f"/api/v1/deployments?limit=3&offset={offset}{query}", headers=self.headers)
            assert answer.status_code == 200, answer.text
            ids += [item["deployment_id"] for item in answer.json()["items"]]
            totals.add(answer.json()["total"])
        return ids, totals
