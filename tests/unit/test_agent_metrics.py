"""Metrics: rolling percentiles per variant, errors by kind, a Telemetry-shaped snapshot and
Prometheus text."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from edgesdk.agent.metrics import Metrics
from edgesdk.agent.serving import ModelServer

from edgesdk.schemas.messages import Telemetry


def test_percentiles_errors_and_snapshot_shape() -> None:
    from tests.unit.test_agent_serving import serve_two

    server = ModelServer()
    serve_two(server)
    metrics = Metrics(server)
    for ms in range(1, 101):
        metrics.observe("fp32", ms / 1000)
    metrics.observe("int8", 0.002)
    metrics.count_error("bad_input")
    metrics.count_error("bad_input")
    metrics.count_error("overload")
    metrics.queue_depth = lambda: 3
    metrics.sensors = lambda: {"temperatures_c": {"soc": 61.5}, "power_source": "battery"}
    metrics.governor_state = lambda: "NOMINAL"
    snap = metrics.snapshot()
    assert snap["latency"]["fp32"]["count"] == 100
    assert abs(snap["latency"]["fp32"]["p50_ms"] - 50.5) < 0.01
    assert abs(snap["latency"]["fp32"]["p99_ms"] - 99.01) < 0.01
    assert snap["errors"] == {"bad_input": 2, "overload": 1}
    assert snap["queue_depth"] == 3 and snap["power_source"] == "battery"
    assert snap["model"]["variant"] == "fp32" and snap["model"]["sha256"] == "0" * 64
    assert snap["throughput_rps"] > 0
    # The link (engineer D) wraps the snapshot into a Telemetry message: it must validate.
    Telemetry(device_id="d", msg_id="m", seq=0, ts=datetime.now(timezone.utc), **snap)


def test_old_samples_leave_the_window() -> None:
    metrics = Metrics(window_s=0.0001)
    metrics.observe("v", 0.01)
    import time

    time.sleep(0.01)
    assert metrics.latency()["v"] == {"count": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None}
    assert metrics.totals() == {"v": 1}


def test_prometheus_text_is_well_formed() -> None:
    metrics = Metrics()
    metrics.observe('odd"variant', 0.001)
    metrics.count_error("runtime")
    text = metrics.prometheus()
    sample = re.compile(r'^edgesdk_agent_[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? -?[0-9.e+-]+$')
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or sample.match(line), line
    assert 'variant="odd\\"variant"' in text
    assert 'edgesdk_agent_errors_total{kind="runtime"} 1' in text


def test_the_window_keeps_the_last_max_samples_only() -> None:
    metrics = Metrics(max_samples=4)
    for ms in range(1, 11):  # 1..10 ms: only 7..10 stay
        metrics.observe("v", ms / 1000)
    stats = metrics.latency()["v"]
    assert stats["count"] == 4 and abs(stats["p50_ms"] - 8.5) < 1e-9
    assert metrics.totals() == {"v": 10}
