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


def test_latency_is_a_cumulative_histogram_per_variant() -> None:
    from edgesdk.agent.metrics import LATENCY_BUCKETS_S

    metrics = Metrics(max_samples=2)  # the histogram counts since start, not the window
    for seconds in (0.0001, 0.00010001, 0.003, 0.003, 42.0):
        metrics.observe("v", seconds)
    text = metrics.prometheus()
    assert "# TYPE edgesdk_agent_inference_latency_seconds histogram" in text
    assert "quantile=" not in text
    buckets = dict(
        re.findall(r'^edgesdk_agent_inference_latency_seconds_bucket\{variant="v",le="([^"]+)"\} (\d+)$', text, re.M)
    )
    assert list(buckets) == [f"{b:g}" for b in LATENCY_BUCKETS_S] + ["+Inf"]
    # "le" is inclusive: exactly 100 µs is in the first bucket, a hair more is not.
    assert buckets["0.0001"] == "1" and buckets["0.00025"] == "2"
    assert buckets["0.0025"] == "2" and buckets["0.005"] == "4" and buckets["10"] == "4"
    assert buckets["+Inf"] == "5"
    assert 'edgesdk_agent_inference_latency_seconds_count{variant="v"} 5' in text
    total = float(re.search(r'_sum\{variant="v"\} (\S+)', text)[1])  # type: ignore[index]
    assert abs(total - (0.0001 + 0.00010001 + 0.006 + 42.0)) < 1e-9
    assert 'edgesdk_agent_inferences_total{variant="v"} 5' in text


def test_every_family_has_help_and_type_and_counters_end_in_total() -> None:
    metrics = Metrics()
    metrics.observe("v", 0.001)
    metrics.count_error("runtime")
    metrics.governor_state = lambda: "NOMINAL"
    families: dict[str, str] = {}
    helped: set[str] = set()
    for line in metrics.prometheus().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            families[name] = kind
        elif line.startswith("# HELP "):
            helped.add(line.split(" ")[2])
        else:
            name = line.split("{")[0].split(" ")[0]
            family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in families else name
            assert family in families, f"sample {name} has no # TYPE"
    assert helped == set(families)
    for name, kind in families.items():
        assert (kind == "counter") == name.endswith("_total"), (name, kind)
