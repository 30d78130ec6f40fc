"""The Kolmogorov-Smirnov distance on binned CDFs beside PSI and Jensen-Shannon (edgesdk/drift/
scores.py, agent/drift/window.py), and the agent's own /metrics drift families (agent/metrics.py,
agent/drift/monitor.py ``readouts``) with a fake model set: scores per tensor and metric,
requests by kind since start, a scrape that leaves telemetry's window whole, and a bounded
number of tensor series."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import pytest
from edgesdk.agent.drift import monitor as drift_monitor
from edgesdk.agent.drift.window import ModelWindow
from edgesdk.agent.metrics import MAX_DRIFT_TENSORS, Metrics
from edgesdk.agent.nonfinite import nonfinite_error

from edgesdk.drift.profile import build_profile
from edgesdk.drift.schema import Histogram, ReferenceProfile, TensorProfile
from edgesdk.drift.scores import ks_distance
from edgesdk.schemas.messages import DriftScore, Telemetry


def test_ks_distance_is_the_largest_gap_of_the_binned_cdfs() -> None:
    # CDFs (0, .5, 1, 1) and (0, 0, .5, 1): the gap is .5 at the second and third edge
    assert ks_distance([0, 0.5, 0.5, 0], [0, 0, 5, 5]) == pytest.approx(0.5)
    assert ks_distance([0.2, 0.3, 0.5], [2, 3, 5]) == pytest.approx(0.0, abs=1e-12)
    assert ks_distance([1, 0, 0], [0, 0, 1]) == pytest.approx(1.0)


def test_binned_ks_never_exceeds_the_ks_of_the_raw_values() -> None:
    rng = np.random.default_rng(3)
    reference, live = rng.normal(size=2000), rng.normal(0.3, 1.2, size=2000)
    edges = np.quantile(reference, np.linspace(0, 1, 11))
    binned = ks_distance(
        *(np.bincount(np.searchsorted(edges, v, side="right"), minlength=12) for v in (reference, live))
    )
    grid = np.sort(np.concatenate([reference, live]))
    raw = np.max(
        np.abs(
            np.searchsorted(np.sort(reference), grid, "right") / 2000
            - np.searchsorted(np.sort(live), grid, "right") / 2000
        )
    )
    assert 0.05 < binned <= raw + 1e-12


def _two_class_profile() -> TensorProfile:
    half = [0.0, 0.5, 0.5, 0.0]
    return TensorProfile(
        ndim=2,
        min=0.0,
        max=1.0,
        histograms=[Histogram(edges=[0.0, 0.5, 1.0], shares=half)],
        classes=[0.9, 0.1],
        confidence=Histogram(edges=[0.5, 0.75, 1.0], shares=half),
    )


def test_ks_reads_ordered_bins_only_not_class_shares() -> None:
    profile = ReferenceProfile(samples=100, inputs={}, outputs={"probs": _two_class_profile()})
    window = ModelWindow(profile)
    for i in range(40):  # values and confidences as the reference's; every answer class 1 (10 % there)
        window.add({}, {"probs": np.array([[0.3, 0.7]] if i % 2 else [[0.2, 0.8]], np.float32)})
    score = window.report().outputs["probs"]
    assert score.psi > 1  # the class shares moved...
    assert score.ks == pytest.approx(0.0, abs=1e-9)  # ...but they have no order, so no CDF to compare


def test_a_drifted_window_reports_ks_beside_psi_and_js() -> None:
    rng = np.random.default_rng(11)
    images = rng.random((300, 3, 8, 8), dtype=np.float32)
    window = ModelWindow(build_profile({"x": images}, {}, classify=False))
    for scale in (1.0, 3.0):
        for _ in range(40):
            window.add({"x": rng.random((1, 3, 8, 8), dtype=np.float32) * scale}, {})
        score = window.report().inputs["x"]
        assert score.ks is not None and (score.ks < 0.1 if scale == 1.0 else score.ks > 0.5), (scale, score)


def test_a_drift_score_with_a_key_this_service_does_not_know_is_read_not_refused() -> None:
    score = DriftScore.model_validate({"psi": 0.3, "js": 0.2, "ks": 0.4, "wasserstein": 1.5})
    assert score == DriftScore(psi=0.3, js=0.2, ks=0.4)
    with pytest.raises(ValueError, match="ks"):
        DriftScore(psi=0.3, js=0.2, ks=1.5)  # still checked: a distance over shares is at most 1


def test_the_fleet_stores_ks_in_the_scores_it_already_keeps() -> None:
    pytest.importorskip("sqlalchemy", reason="needs the fleet-service extra")
    from edgesdk.fleet.service.quality import quality_rows

    message = Telemetry.model_validate(
        {
            "device_id": "dev-1",
            "msg_id": "m1",
            "seq": 1,
            "ts": "2026-12-06T05:00:00Z",
            "model": {"name": "digits", "version": "1.0.0", "release": 1, "variant": "onnx-fp32", "sha256": "0" * 64},
            "quality": {
                "samples": 5,
                "reference": True,
                "inputs": {"x": {"psi": 0.3, "js": 0.2, "ks": 0.4}},
                "outputs": {"probs": {"psi": 0.03, "js": 0.05}},
            },
        }
    )
    (row,) = quality_rows(message)
    scores = json.loads(row["scores"])  # the scores JSON column: no migration
    assert scores["inputs"]["x"] == {"psi": 0.3, "js": 0.2, "ks": 0.4}
    assert scores["outputs"]["probs"] == {"psi": 0.03, "js": 0.05}  # none given: stored as before, no null


# -- the agent's /metrics --------------------------------------------------------------------------


class _Models:
    """Two served models, ``digits`` (input ``x``) and ``kws``, each with its own server and taps."""

    def __init__(self) -> None:
        self.default_server = SimpleNamespace(taps=[], model=None)
        self._entries = {name: self._entry(name) for name in ("digits", "kws")}

    @staticmethod
    def _entry(name: str) -> Any:
        inputs = [SimpleNamespace(name=f"{name}-x")]
        model = SimpleNamespace(bundle_sha256=f"{name}-sha", signature=SimpleNamespace(inputs=inputs))
        return SimpleNamespace(name=name, server=SimpleNamespace(taps=[], model=model), store=None)

    def entries(self) -> list[Any]:
        return list(self._entries.values())

    def entry(self, name: str) -> Any:
        return self._entries[name]


def _profile(inputs: list[str]) -> ReferenceProfile:
    rng = np.random.default_rng(5)
    return build_profile({n: rng.random((300, 1, 8, 8), dtype=np.float32) for n in inputs}, {}, classify=False)


@pytest.fixture
def watched() -> Any:
    """A Metrics page and the drift monitor of a fake model set, each model's bundle profiled."""
    models, events, metrics = _Models(), SimpleNamespace(subscribe=lambda fn: None), Metrics()
    profiles = {"digits-sha": _profile(["digits-x"]), "kws-sha": _profile(["kws-x"])}
    with mock.patch.object(drift_monitor, "installed_reference", lambda store, sha: profiles[sha]):
        monitor = drift_monitor.watch_drift(models, events, metrics)
        yield SimpleNamespace(metrics=metrics, monitor=monitor)


def _answer(monitor: Any, name: str, scale: float, count: int = 20) -> None:
    rng = np.random.default_rng(7)
    for _ in range(count):
        monitor.tap(name, {f"{name}-x": rng.random((1, 1, 8, 8), dtype=np.float32) * scale}, {}, "v")


def _value(page: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", page, re.M)
    assert found, f"{series} not on the page:\n{page}"
    return float(found[1])


def test_agent_metrics_show_each_models_drift_scores_and_request_counts_without_a_fleet(watched: Any) -> None:
    _answer(watched.monitor, "digits", scale=1.0)
    _answer(watched.monitor, "kws", scale=3.0)
    nonfinite_error("kws-x")
    page = watched.metrics.prometheus()
    assert "# TYPE edgesdk_agent_drift_score gauge" in page and "# HELP edgesdk_agent_drift_score " in page
    assert "# TYPE edgesdk_agent_drift_requests_total counter" in page
    calm = 'edgesdk_agent_drift_score{model="digits",direction="input",tensor="digits-x",metric="%s"}'
    drifted = 'edgesdk_agent_drift_score{model="kws",direction="input",tensor="kws-x",metric="%s"}'
    assert _value(page, calm % "psi") < 0.1 and _value(page, drifted % "psi") > 0.25
    assert _value(page, calm % "ks") < 0.1 and _value(page, drifted % "ks") > 0.5
    assert _value(page, drifted % "js") > _value(page, calm % "js")
    requests = 'edgesdk_agent_drift_requests_total{model="kws",kind="%s"}'
    assert _value(page, requests % "sampled") == 20 and _value(page, requests % "out_of_range") == 20
    assert _value(page, requests % "nonfinite") == 1


def test_a_metrics_scrape_leaves_the_telemetry_window_whole(watched: Any) -> None:
    _answer(watched.monitor, "kws", scale=3.0)
    watched.metrics.prometheus()
    quality = watched.metrics.quality_reports()["kws"]
    assert quality.samples == 20 and quality.inputs["kws-x"].psi > 0.25
    page = watched.metrics.prometheus()  # reported: the counters stay, the scores are the last window's
    assert _value(page, 'edgesdk_agent_drift_requests_total{model="kws",kind="sampled"}') == 20
    assert _value(page, 'edgesdk_agent_drift_score{model="kws",direction="input",tensor="kws-x",metric="psi"}') > 0.25


def test_with_no_telemetry_a_scrape_closes_a_window_once_it_is_roll_s_old(watched: Any) -> None:
    _answer(watched.monitor, "kws", scale=3.0)
    psi = 'edgesdk_agent_drift_score{model="kws",direction="input",tensor="kws-x",metric="psi"}'
    later = drift_monitor.time.monotonic() + drift_monitor.ROLL_S
    with mock.patch.object(drift_monitor.time, "monotonic", lambda: later):
        assert _value(watched.metrics.prometheus(), psi) > 0.25  # the closed window's, until one is scored
        _answer(watched.monitor, "kws", scale=1.0)
        page = watched.metrics.prometheus()
    assert _value(page, psi) < 0.1  # the calm traffic since, not every request since start
    assert _value(page, 'edgesdk_agent_drift_requests_total{model="kws",kind="sampled"}') == 40


def test_agent_drift_series_are_capped_per_model_and_direction() -> None:
    names = [f"in{i:02d}" for i in range(MAX_DRIFT_TENSORS + 4)]
    profile = _profile(names)
    score = DriftScore(psi=0.1, js=0.1, ks=0.1)
    quality = SimpleNamespace(inputs=dict.fromkeys(names, score), outputs={}, window_s=1.0)
    metrics = Metrics()
    readout = drift_monitor.DriftReadout(quality, dict.fromkeys(drift_monitor.REQUEST_KINDS, 0))  # type: ignore[arg-type]
    metrics.attach_quality(dict, readouts=lambda: {"m": readout})
    page = metrics.prometheus()
    listed = set(re.findall(r'edgesdk_agent_drift_score\{[^}]*tensor="([^"]+)",metric="psi"\}', page))
    assert listed == set(sorted(profile.inputs)[:MAX_DRIFT_TENSORS])


def test_agent_drift_labels_from_a_signed_bundles_tensor_names_are_escaped() -> None:
    import shutil
    import subprocess

    names = ['x" } evil_metric 1\n# TYPE', "back\\slash"]
    quality = SimpleNamespace(
        inputs=dict.fromkeys(names, DriftScore(psi=0.3, js=0.2, ks=0.1)), outputs={}, window_s=1.0
    )
    readout = drift_monitor.DriftReadout(quality, dict.fromkeys(drift_monitor.REQUEST_KINDS, 1))  # type: ignore[arg-type]
    metrics = Metrics()
    metrics.attach_quality(dict, readouts=lambda: {"m": readout})
    page = metrics.prometheus()
    assert 'tensor="x\\" } evil_metric 1\\n# TYPE",metric="psi"} 0.3' in page
    assert not re.search(r"^evil_metric", page, re.M)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; scripts/test installs it)")
    checked = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, f"{checked.stdout}{checked.stderr}\n---\n{page}"
