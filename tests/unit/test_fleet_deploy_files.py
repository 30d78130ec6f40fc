"""deploy/: the alert rules pass ``promtool check rules`` and their own ``promtool test rules``;
the service's /metrics page passes ``promtool check metrics`` and exports every metric the
rules and the Grafana dashboard use; the systemd unit and the container recipe start the
service with flags it has."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "fleet-alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "edgesdk-fleet.json"
_METRIC = re.compile(r"\bedgesdk_fleet_[a-z0-9_]+")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not installed (Debian prometheus; scripts/test installs it)")
    return found


def test_alert_rules_are_valid_and_fire_as_their_tests_say() -> None:
    promtool = _promtool()
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", "fleet-alerts.test.yml"], capture_output=True, text=True, cwd=RULES.parent
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _metrics_page(tmp_path: Path) -> str:
    pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
    from edgesdk.fleet.service.database import migrate, open_engine
    from edgesdk.fleet.service.ingest import Ingest
    from edgesdk.fleet.service.metrics import FleetMetrics
    from edgesdk.fleet.service.store import SqlRolloutStore
    from tests.unit.test_fleet_service_store import _telemetry, _template

    engine = open_engine(f"sqlite:///{tmp_path / 'm.sqlite3'}")
    migrate(engine)
    store = SqlRolloutStore(engine)
    bundle = tmp_path / "b.edgepkg"
    bundle.write_bytes(b"x")
    store.create(_template("dep-1"), bundle, {}, [["dev-1"], ["dev-2"]])
    store.set_state("dep-1", "ABORTED", reason="canary failed")
    ingest = Ingest(engine, "edgesdk", store).start()
    now = datetime.now(timezone.utc)
    for seq, device in enumerate(["dev-1", "dev-2", "dev-1"]):
        ingest.handle(
            f"edgesdk/devices/{device}/telemetry", _telemetry(device, seq, now - timedelta(seconds=30), 3.0 + seq)
        )
    presence = {"device_id": "dev-1", "online": True, "ts": now.isoformat(), "groups": ["a"]}
    ingest.handle("edgesdk/devices/dev-1/presence", json.dumps(presence).encode())
    ingest.handle("edgesdk/devices/dev-1/events", b"garbage")
    assert ingest.drain(10)
    ingest.stop()
    page = FleetMetrics(engine).render()
    engine.dispose()
    return page


def test_metrics_page_passes_promtool_and_has_what_rules_and_dashboard_use(tmp_path: Path) -> None:
    page = _metrics_page(tmp_path)
    assert 'edgesdk_fleet_devices{state="online"} 1.0' in page
    assert 'edgesdk_fleet_rollout_info{deployment="dep-1",state="ABORTED"} 1.0' in page
    assert 'edgesdk_fleet_ingest_total{kind="malformed"} 1.0' in page
    assert 'edgesdk_fleet_reported_p95_latency_seconds_count{version="1.0.0"} 3.0' in page
    assert (
        'edgesdk_fleet_device_latency_seconds{device="dev-1",model="digits",version="1.0.0",percentile="p95"} 0.005'
        in page
    )
    promtool = _promtool()
    checked = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    exported = set(re.findall(r"^# TYPE (\S+)", page, re.M))
    dashboard = json.loads(DASHBOARD.read_text())
    used = set(_METRIC.findall(RULES.read_text()))
    used |= {name for panel in dashboard["panels"] for t in panel["targets"] for name in _METRIC.findall(t["expr"])}
    used = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    assert used and used <= exported, used - exported


def test_prometheus_scrape_config_is_valid_and_scrapes_the_units_metrics_listener() -> None:
    promtool = _promtool()
    config = DEPLOY / "prometheus" / "prometheus.yml"
    checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    unit = (DEPLOY / "systemd" / "edgesdk-fleet.service").read_text()
    [listen] = re.findall(r"FLEET_METRICS=(\S+)", unit)
    assert f'targets: ["{listen}"]' in config.read_text()
    assert "--metrics-listen ${FLEET_METRICS}" in unit


def test_systemd_unit_and_container_start_the_service_with_real_flags(edgesdk_cli) -> None:
    help_text = edgesdk_cli("fleet", "serve", "--help").stdout
    unit = (DEPLOY / "systemd" / "edgesdk-fleet.service").read_text()
    [exec_start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    container = (DEPLOY / "Containerfile").read_text()
    [entrypoint] = [line for line in container.splitlines() if line.startswith("ENTRYPOINT")]
    for command in (exec_start, " ".join(json.loads(entrypoint.split(" ", 1)[1]))):
        assert "edgesdk fleet serve" in command, command
        for flag in re.findall(r"(--[a-z-]+)", command):
            assert flag in help_text, (flag, command)
    assert "KillSignal=SIGTERM" in unit and "STOPSIGNAL SIGTERM" in container
