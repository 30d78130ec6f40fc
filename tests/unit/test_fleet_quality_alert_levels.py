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
        scores = {"mel": {"psi": 0.1 * seq, "js": 0.01, "ks": 0.02 + 0.1 * seq}}
        outputs = {"label": {"psi": 0.01, "js": 0.01}}  # no ks: class shares have no order
        figures = {"samples": 50, "reference": True, "inputs": scores, "outputs": outputs}
        figures |= {"out_of_range": seq, "constant": 1}
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
    assert f'edgesdk_fleet_model_drift_ks{{{labels},tensor="mel",direction="input"}} 0.02' in page
    assert re.search(r"^# TYPE edgesdk_fleet_model_drift_ks gauge$", page, re.M)
    assert 'edgesdk_fleet_model_drift_ks{device="dev-1",model="kws",tensor="label"' not in page
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


#: One device's input x, a report a minute: (minute, PSI or None when the report did not score x).
#: Drifted from minute 1; minutes 4-6 and 10-19 too sparse to score it (held: the run goes on,
#: the alert fires at 11); 20-21 unscored for over HOLD_S since minute 9 (stale: the run ends);
#: drifted again from 22 (a new run). Every report scores the output y (PSI 0.02).
SPARSE_X = [(0, 0.05), *((m, 0.4) for m in (1, 2, 3, 7, 8, 9, 22, 23, 24))]
SPARSE_MINUTES = 25


def _sparse_report(minute: int, start: datetime) -> bytes:
    scored = dict(SPARSE_X)
    inputs = {"x": {"psi": scored[minute], "js": 0.2, "ks": 0.3}} if minute in scored else {}
    figures = {"samples": 3, "reference": True, "inputs": inputs, "outputs": {"y": {"psi": 0.02, "js": 0.01}}}
    model = {"name": "digits", "version": "1.0.0", "release": 1, "variant": "onnx-fp32", "sha256": "d" * 64}
    report = {"device_id": "dev-s", "msg_id": f"s{minute}", "seq": minute}
    report |= {"ts": (start + timedelta(minutes=minute)).isoformat(), "models": [{"model": model, "quality": figures}]}
    return json.dumps(report).encode()


def test_a_report_too_sparse_to_score_a_tensor_neither_ends_nor_starts_its_drift_run_in_both_alerts(
    tmp_path: Path,
) -> None:
    """Minute by minute, the fleet's /metrics as Prometheus would scrape it is fed to the shipped
    rule (promtool test rules) and the dashboard's condition is read from the same rows: both
    alert from minute 11 to 19 (the drift run from minute 1, through the unscored reports) and not
    at 20 (x's score stale), nor by 24 (the new run is 3 minutes old)."""
    from edgesdk.fleet.service.database import Transaction, migrate, open_engine
    from edgesdk.fleet.service.ingest import Ingest
    from edgesdk.fleet.service.metrics import FleetMetrics
    from edgesdk.fleet.service.store import SqlRolloutStore

    engine = open_engine(f"sqlite:///{tmp_path / 'sparse.sqlite3'}")
    migrate(engine)
    ingest = Ingest(engine, "edgesdk", SqlRolloutStore(engine)).start()
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    scraped, dashboard = [], []
    series = re.compile(
        r'^edgesdk_fleet_model_drift_psi\{device="dev-s",model="digits",tensor="x",direction="input"\} (\S+)$', re.M
    )
    for minute in range(SPARSE_MINUTES):
        ingest.handle("edgesdk/devices/dev-s/telemetry", _sparse_report(minute, start))
        assert ingest.drain(10)
        now = (start + timedelta(minutes=minute)).timestamp()
        found = series.search(FleetMetrics(engine).render(now=now))
        scraped.append(found.group(1) if found else "stale")
        with Transaction(engine) as db:
            alerts = [a for a in quality.quality_alerts(db, now) if a.kind == "model_drift"]
        dashboard.append(alerts[0] if alerts else None)
    ingest.stop()
    engine.dispose()
    assert scraped[4:7] == ["0.4"] * 3 and scraped[19:22] == ["0.4", "stale", "stale"], scraped
    firing = [m for m, a in enumerate(dashboard) if a is not None]
    assert firing == list(range(11, 20)), firing
    assert {(a.tensor, a.figure, a.since) for a in dashboard if a} == {("input x", 0.4, start.timestamp() + 60)}
    _promtool_agrees(tmp_path, scraped, {m: a for m, a in enumerate(dashboard) if a is not None})


def _promtool_agrees(tmp_path: Path, scraped: list[str], firing: dict[int, quality.QualityAlert]) -> None:
    """The shipped rule on the scraped values fires at exactly the dashboard's minutes, with its figure."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian prometheus; scripts/test installs it)")
    labels = {"device": "dev-s", "model": "digits", "tensor": "x", "direction": "input"}
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    description = _rule("FleetModelDrift")["annotations"]["description"]

    def expected(alert: quality.QualityAlert) -> list[dict]:
        summary = f"{alert.model} on {alert.device_id} drifts: PSI {alert.figure:.2f} on {alert.tensor}"
        return [
            {
                "exp_labels": {"severity": "warning", **labels},
                "exp_annotations": {"summary": summary, "description": description},
            }
        ]

    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"edgesdk_fleet_model_drift_psi{{{selector}}}", "values": " ".join(scraped)}
                ],
                "alert_rule_test": [
                    {
                        "eval_time": f"{m}m",
                        "alertname": "FleetModelDrift",
                        "exp_alerts": expected(firing[m]) if m in firing else [],
                    }
                    for m in range(len(scraped))
                ],
            }
        ],
    }
    (tmp_path / "sparse.test.yml").write_text(yaml.safe_dump(tests))
    checked = subprocess.run(
        [promtool, "test", "rules", "sparse.test.yml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_reports_stored_in_one_shuffled_batch_hold_scores_as_when_stored_one_by_one(tmp_path: Path) -> None:
    """The ingest works out what each report holds from its model's previous report, in the same
    batch or stored before: one batch (in any order) stores the same as one report at a time."""
    import sqlalchemy as sa

    from edgesdk.fleet.service import schema
    from edgesdk.fleet.service.database import Transaction, migrate, open_engine
    from edgesdk.schemas.messages import Telemetry

    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    reports = [Telemetry.model_validate_json(_sparse_report(m, start)) for m in range(SPARSE_MINUTES)]
    stored = []
    for name, batches in (("one-by-one", [[r] for r in reports]), ("one-batch", [reports[::-1]])):
        engine = open_engine(f"sqlite:///{tmp_path / name}.sqlite3")
        migrate(engine)
        writer = quality.QualityWriter(engine)
        for batch in batches:
            with Transaction(engine) as db:
                writer.write(db, batch)
        with Transaction(engine) as db:
            table = schema.model_quality
            stored.append(dict(db.execute(sa.select(table.c.msg_id, table.c.scores)).all()))
        engine.dispose()
    assert stored[0] == stored[1]
    held = json.loads(stored[0]["s5"])  # minute 5 scores y only: it holds x from minute 3
    assert held["held"]["inputs"]["x"] == {"psi": 0.4, "js": 0.2, "ks": 0.3, "ts": start.timestamp() + 180}
    assert held["drifting"] == {"inputs": {"x": start.timestamp() + 60}, "outputs": {}}
    assert "held" not in json.loads(stored[0]["s20"])  # x unscored since minute 9: stale
