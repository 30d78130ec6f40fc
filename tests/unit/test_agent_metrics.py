"""Metrics: rolling percentiles per variant, errors by kind, a Telemetry-shaped snapshot and
Prometheus text."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest
from edgesdk.agent.api.http import Response
from edgesdk.agent.governor.sensors import SensorReading
from edgesdk.agent.metrics import Metrics
from edgesdk.agent.serving import ModelServer

from edgesdk.errors import AgentError
from edgesdk.mqtt.queue import MessageQueue
from edgesdk.schemas.agent_config import AgentConfig
from edgesdk.schemas.messages import RunningModel, Telemetry


@dataclass
class StillGovernor:
    """A GovernorReadout that never changes."""

    state: str = "NOMINAL"
    last_reading: SensorReading = field(default_factory=SensorReading)


def test_percentiles_errors_and_snapshot_shape() -> None:
    from tests.unit.test_agent_serving import serve_two

    server = ModelServer()
    serve_two(server)
    reading = SensorReading(temperatures_c={"soc": 61.5}, power_source="battery")
    metrics = Metrics(server, governor=StillGovernor(last_reading=reading))
    for ms in range(1, 101):
        metrics.observe("fp32", ms / 1000)
    metrics.observe("int8", 0.002)
    metrics.count_error("bad_input")
    metrics.count_error("bad_input")
    metrics.count_error("overload")
    metrics.requests.count = 3  # what the API counts while three requests run or wait
    snap = metrics.snapshot()
    assert snap["latency"]["fp32"]["count"] == 100
    assert abs(snap["latency"]["fp32"]["p50_ms"] - 50.5) < 0.01
    assert abs(snap["latency"]["fp32"]["p99_ms"] - 99.01) < 0.01
    assert snap["errors"] == {"bad_input": 2, "overload": 1}
    assert snap["queue_depth"] == 3 and snap["power_source"] == "battery"
    assert snap["temperatures_c"] == {"soc": 61.5} and snap["governor_state"] == "NOMINAL"
    assert isinstance(snap["model"], RunningModel) and snap["model"] == server.running_model()
    assert snap["model"].variant == "fp32" and snap["model"].sha256 == "0" * 64
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
    metrics = Metrics(governor=StillGovernor())
    metrics.observe("v", 0.001)
    metrics.count_error("runtime")
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


def _outbox_with(tmp_path: Path, messages: int) -> MessageQueue:
    outbox = MessageQueue(tmp_path / "outbox.sqlite3")
    for i in range(messages):
        outbox.enqueue("edgesdk/devices/d/telemetry", f"m{i}".encode())
    return outbox


def _with_requests_waiting(check: object, waiting: int = 3) -> list[Response]:
    """Run ``check(app, metrics)`` while ``waiting`` requests run or wait in a real ApiApp."""
    from tests.unit.test_agent_api_app import FakeModel, infer_request, make_app

    model = FakeModel(1.0)
    model.gate = threading.Event()
    app, metrics = make_app(model, max_concurrency=1, max_queue=waiting)
    answers: list[Response] = []

    async def main() -> None:
        app.loop = asyncio.get_running_loop()
        for _ in range(waiting):
            app.handle(infer_request(), answers.append)
        await asyncio.sleep(0.05)
        try:
            check(app, metrics)  # type: ignore[operator]
        finally:
            model.gate.set()
        assert await app.drain(5)

    asyncio.run(main())
    app.close()
    return answers


def test_queue_depth_is_the_apis_requests_and_the_outbox_is_a_metric_of_its_own(tmp_path: Path) -> None:
    outbox = _outbox_with(tmp_path, 7)

    def check(app, metrics: Metrics) -> None:
        assert app.in_flight == 3
        metrics.attach_outbox(outbox)  # what the daemon does once its MQTT link is up
        assert metrics.snapshot()["queue_depth"] == 3
        text = metrics.prometheus()
        assert "\nedgesdk_agent_queue_depth 3\n" in text
        assert "\nedgesdk_agent_mqtt_outbox_messages 7\n" in text
        assert "\nedgesdk_agent_mqtt_outbox_dropped_total 0\n" in text

    answers = _with_requests_waiting(check)
    assert [a.status for a in answers] == [200, 200, 200]
    outbox.close()


def test_without_a_link_there_is_no_outbox_metric_and_one_agent_has_one_outbox(tmp_path: Path) -> None:
    metrics = Metrics()
    assert "outbox" not in metrics.prometheus()
    first, second = _outbox_with(tmp_path / "a", 0), _outbox_with(tmp_path / "b", 0)
    metrics.attach_outbox(first)
    metrics.attach_outbox(first)  # the same one again is harmless
    with pytest.raises(AgentError, match="already report an MQTT outbox"):
        metrics.attach_outbox(second)
    first.close()
    second.close()


def test_link_telemetry_keeps_the_apis_queue_depth_and_reports_the_outbox_beside_it(tmp_path: Path) -> None:
    """The bug this guards: the link used to re-point queue_depth at its outbox."""
    pytest.importorskip("paho.mqtt", reason="the MQTT link needs paho-mqtt (pip install 'edgesdk[agent]')")
    from edgesdk.agent.link import AgentLink

    config = AgentConfig(
        device_id="d", profile="rpi5-8gb", data_dir=tmp_path, mqtt={"enabled": True, "broker": "mqtt://127.0.0.1:1"}
    )
    seen: dict[str, int] = {}

    def check(app, metrics: Metrics) -> None:
        link = AgentLink(config, telemetry=metrics, running_model=app.server)  # built, never connected
        metrics.attach_outbox(link.queue)
        link.publish_reliable(
            "telemetry-test", Telemetry(device_id="d", msg_id="x", seq=0, ts=datetime.now(timezone.utc))
        )
        telemetry = json.loads(link.telemetry_payload(1))
        seen.update(queue_depth=telemetry["queue_depth"], outbox_depth=telemetry["outbox_depth"])
        seen.update(dropped=telemetry["dropped_messages"], snapshot_depth=metrics.snapshot()["queue_depth"])
        assert telemetry["model"]["name"] == "m" and telemetry["model"]["variant"] == "fp32"
        link.queue.close()

    _with_requests_waiting(check)
    assert seen == {"queue_depth": 3, "outbox_depth": 1, "dropped": 0, "snapshot_depth": 3}


def test_queued_samples_are_folded_once_each_whoever_folds_them() -> None:
    """``observe`` queues; readers and every 256th sample fold. Four threads observing two
    variants past the fold threshold while a reader folds too: every sample lands once, in its
    variant's window, buckets and sum; samples still queued are seen by the next reader."""
    from edgesdk.agent.metrics import LATENCY_BUCKETS_S, InferenceStats

    stats = InferenceStats(max_samples=100_000)
    stop = threading.Event()

    def observe(variant: str, seconds: float) -> None:
        for _ in range(5_000):
            stats.observe(variant, seconds)

    def read() -> None:
        while not stop.is_set():
            stats.totals()

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=observe, args=(v, s)) for v, s in [("a", 0.0002), ("b", 0.003)] * 2]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    stop.set()
    reader.join()
    stats.observe("a", 0.0002)  # one more, queued: no reader has folded it yet
    assert stats.totals() == {"a": 10_001, "b": 10_000}
    windows = dict(stats.windows())
    assert len(windows["a"].seconds) == 10_001 and len(windows["b"].times) == 10_000
    first_over_a = LATENCY_BUCKETS_S.index(0.00025)
    assert windows["a"].bucket_counts[first_over_a] == 10_001 and sum(windows["a"].bucket_counts) == 10_001
    assert windows["b"].bucket_counts[LATENCY_BUCKETS_S.index(0.005)] == 10_000
    assert abs(windows["b"].sum_s - 30.0) < 1e-6
    assert stats.latency()["a"]["count"] == 10_001 and stats.throughput_rps() > 0
