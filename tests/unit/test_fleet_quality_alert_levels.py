"""The model-quality alerts (issue 41) say the same thing in both places: the shipped Prometheus
rules use the thresholds the dashboard's alerts read (``edgesdk.fleet.service.quality``), and the
service's /metrics page, with quality reports stored, exports what those rules read and passes
``promtool check metrics``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy", reason="the fleet service needs the fleet-service extra")
yaml = pytest.importorskip("yaml")

from edgesdk.fleet.service import quality  # noqa: E402

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "fleet-alerts.yml"


def _rule(name: str) -> dict:
    [rule] = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r.get("alert") == name]
    return rule


def test_prometheus_quality_rules_use_the_thresholds_of_the_dashboards_alerts() -> None:
    drift = _rule("FleetModelDrift")
    assert drift["expr"].strip() == f"edgesdk_fleet_model_drift_psi > {quality.DRIFT_PSI}"
    assert drift["for"] == f"{quality.DRIFT_FOR_S / 60:.0f}m"
    window = f"[{quality.QUALITY_WINDOW_S / 60:.0f}m]"
    for name, kind, share in (
        ("FleetModelNonFiniteInputs", "nonfinite", quality.NONFINITE_SHARE),
        ("FleetModelInputsOutOfRange", "out_of_range", quality.OUT_OF_RANGE_SHARE),
    ):
        expr = " ".join(_rule(name)["expr"].split())
        assert f'{{kind="{kind}"}}{window}' in expr and expr.endswith(f"> {share}"), expr
        assert 'kind=~"sampled|nonfinite"' in expr  # the requests seen: sketched plus refused


def test_metrics_page_with_quality_reports_exports_drift_and_counts_and_passes_promtool(tmp_path: Path) -> None:
    from edgesdk.fleet.service.database import migrate, open_engine
    from edgesdk.fleet.service.ingest import Ingest
    from edgesdk.fleet.service.metrics import FleetMetrics
    from edgesdk.fleet.service.store import SqlRolloutStore

    engine = open_engine(f"sqlite:///{tmp_path / 'q.sqlite3'}")
    migrate(engine)
    ingest = Ingest(engine, "edgesdk", SqlRolloutStore(engine)).start()
    model = {"name": "kws", "version": "2.0.0", "release": 2, "variant": "tflite-int8", "sha256": "c" * 64}
    now = datetime.now(UTC)
    for seq in range(3):
        scores = {"mel": {"psi": 0.1 * seq, "js": 0.01}}
        figures = {"samples": 50, "reference": True, "inputs": scores, "out_of_range": seq, "constant": 1}
        report = {
            "device_id": "dev-1",
            "msg_id": f"m{seq}",
            "seq": seq,
            "ts": (now - timedelta(seconds=seq)).isoformat(),
        }
        report |= {"models": [{"model": model, "quality": figures}]}  # a second model: in models only
        ingest.handle("edgesdk/devices/dev-1/telemetry", json.dumps(report).encode())
    assert ingest.drain(10)
    ingest.stop()
    page = FleetMetrics(engine).render()
    engine.dispose()
    labels = 'device="dev-1",model="kws"'
    assert f'edgesdk_fleet_model_drift_psi{{{labels},tensor="mel",direction="input"}} 0.0' in page  # the newest: seq 0
    assert f'edgesdk_fleet_model_requests_total{{{labels},kind="out_of_range"}} 3.0' in page
    assert f'edgesdk_fleet_model_requests_total{{{labels},kind="constant"}} 3.0' in page
    assert re.search(r"^# TYPE edgesdk_fleet_model_requests_total counter$", page, re.M)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian prometheus; scripts/test installs it)")
    checked = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_line_chart_draws_an_alert_level_inside_its_value_axis() -> None:
    from edgesdk.fleet.service.charts import line_chart

    svg = line_chart({"input x": [(0.0, 0.05), (60.0, 0.1)]}, unit="PSI", title="drift", threshold=0.25)
    assert svg.count('class="threshold"') == 1
    assert ">0.25 PSI</text>" in svg  # the axis reaches the level even when every value is under it
