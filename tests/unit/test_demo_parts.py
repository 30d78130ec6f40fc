"""The demo's own parts that need no broker or agent: metrics parsing, finding the heat
episode, the heat trace against the profile's thermal points, and the process set."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from edgesdk.demo.collector import (
    LatencyRate,
    Sample,
    histogram_quantile,
    parse_latency_histograms,
)
from edgesdk.demo.processes import ProcessSet
from edgesdk.demo.story import find_step_down_and_up
from edgesdk.demo.traces import write_heat_trace, write_idle_trace
from edgesdk.profiles import get_profile


def test_parse_latency_reads_the_agents_histogram_per_variant() -> None:
    from edgesdk.agent.metrics import Metrics

    metrics = Metrics()
    for _ in range(3):
        metrics.observe("onnx-fp32", 0.0004)
    metrics.observe('odd"variant', 0.02)
    parsed = parse_latency_histograms(metrics.prometheus())
    assert set(parsed) == {"onnx-fp32", 'odd"variant'}
    fp32 = dict(parsed["onnx-fp32"])
    assert fp32[0.00025] == 0 and fp32[0.0005] == 3 and fp32[float("inf")] == 3
    assert [le for le, _ in parsed["onnx-fp32"]] == sorted(fp32)  # ascending, +Inf last
    assert dict(parsed['odd"variant'])[0.025] == 1
    assert parse_latency_histograms("") == {}


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    inf = float("inf")
    # 10 in (0, 1 ms], 10 in (1, 2 ms], none above.
    buckets = [(0.001, 10.0), (0.002, 20.0), (inf, 20.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.001)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.0005)
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.0019)
    # In the +Inf bucket only the highest finite bound is known.
    assert histogram_quantile(0.99, [(0.001, 1.0), (inf, 100.0)]) == pytest.approx(0.001)
    assert histogram_quantile(0.5, [(0.001, 0.0), (inf, 0.0)]) is None
    assert histogram_quantile(0.5, []) is None


def test_latency_rate_uses_the_increase_over_the_window_and_survives_a_restart() -> None:
    inf = float("inf")
    rate = LatencyRate(window_s=5.0)
    slow = {"v": [(0.001, 0.0), (0.01, 100.0), (inf, 100.0)]}  # 100 slow requests first
    assert rate.update(0.0, slow)["v"][-1] == (inf, 100.0)  # first scrape: since start
    fast = {"v": [(0.001, 50.0), (0.01, 150.0), (inf, 150.0)]}  # then 50 fast ones
    assert rate.update(1.0, fast)["v"] == [(0.001, 50.0), (0.01, 50.0), (inf, 50.0)]
    # 10 s later the slow burst left the window: only what happened since t=1 counts.
    later = {"v": [(0.001, 60.0), (0.01, 160.0), (inf, 160.0)]}
    assert rate.update(11.0, later)["v"] == [(0.001, 10.0), (0.01, 10.0), (inf, 10.0)]
    restarted = {"v": [(0.001, 2.0), (0.01, 2.0), (inf, 2.0)]}  # counters went back
    assert rate.update(12.0, restarted)["v"] == restarted["v"]


def sample(t: float, variant: str | None, precision: str | None) -> Sample:
    return Sample(t, 50.0, variant, precision, 1, "1.0.0", "NOMINAL", None, None, None)


F32, F16, I8 = ("onnx-fp32", "fp32"), ("onnx-fp16", "fp16"), ("onnx-int8", "int8")


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        ([F32, F16, I8, F16, F32], (1, 4, "int8")),  # the whole ladder down and back
        ([F16, I8, F32], (0, 2, "int8")),  # already stepped down when first seen
        ([F32, F16, F32, I8, F32], (1, 2, "fp16")),  # the first episode counts
        ([F32, F16, I8], None),  # not back up yet
        ([F32, F32], None),  # never stepped down
        ([], None),
    ],
)
def test_find_step_down_and_up(sequence, expected) -> None:
    series = [sample(float(i), v, p) for i, (v, p) in enumerate(sequence)]
    found = find_step_down_and_up(series, "fp32")
    if expected is None:
        assert found is None
    else:
        down, up, lowest = found
        assert (down.t, up.t, lowest) == (float(expected[0]), float(expected[1]), expected[2])


@pytest.mark.parametrize("profile_name", ["rpi5-8gb", "jetson-orin-nano-8gb"])
def test_heat_trace_crosses_step_down_without_throttling_and_cools_below_step_up(tmp_path, profile_name) -> None:
    thermal = get_profile(profile_name).thermal
    entries = [json.loads(line) for line in write_heat_trace(tmp_path / "t.jsonl", thermal).read_text().splitlines()]
    temps = [e["temperatures_c"]["soc"] for e in entries]
    assert [e["at_s"] for e in entries] == sorted(e["at_s"] for e in entries)
    assert max(temps) >= thermal.step_down_c and max(temps) < thermal.throttle_c
    assert min(temps) <= thermal.step_up_c
    idle = write_idle_trace(tmp_path / "i.jsonl", thermal, seed=1).read_text().splitlines()
    assert all(json.loads(line)["temperatures_c"]["soc"] < thermal.step_up_c for line in idle)


@pytest.mark.parametrize("leader_ignores_sigterm", [True, False])
def test_process_set_stops_every_group_including_grandchildren(tmp_path: Path, leader_ignores_sigterm: bool) -> None:
    """A child with a child of its own that ignores SIGTERM: both are gone after stop_all,
    whether the child itself ignores SIGTERM or exits on it."""
    script = tmp_path / "stubborn.py"
    grandchild_code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if leader_ignores_sigterm else "")
        + f"child = subprocess.Popen([sys.executable, '-c', {grandchild_code!r}])\n"
        f"open({str(tmp_path / 'grandchild.pid')!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    processes = ProcessSet()
    pid = processes.start("stubborn", [sys.executable, str(script)], log_file=tmp_path / "log")
    pid_file = tmp_path / "grandchild.pid"
    deadline = time.monotonic() + 30
    # The file exists a moment before its number is written: wait for the number, not the file.
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    began = time.monotonic()
    processes.stop_all(grace_s=1.0)
    assert time.monotonic() - began < 10
    assert processes.exited() == {"stubborn": -9 if leader_ignores_sigterm else -15}
    for gone in (pid, grandchild):
        deadline = time.monotonic() + 5
        while _alive(gone) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(gone), gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class _ScriptedService:
    """Stands in for DemoService: its client answers GET /deployments/ID from a script."""

    def __init__(self, details: list[dict]) -> None:
        self.details = details
        self.client = self
        self.log_file = Path("service.log")

    def deployment(self, _deployment_id: str) -> dict:
        return self.details.pop(0) if len(self.details) > 1 else self.details[0]


def test_follow_deployment_reports_each_new_wave_then_the_abort_and_the_end(monkeypatch) -> None:
    from edgesdk.demo import fleet_service

    monkeypatch.setattr(fleet_service, "_POLL_S", 0.0)
    script = [
        {"state": "PENDING", "wave": 0, "reason": ""},
        {"state": "IN_PROGRESS", "wave": 0, "reason": ""},
        {"state": "IN_PROGRESS", "wave": 0, "reason": ""},
        {"state": "IN_PROGRESS", "wave": 1, "reason": ""},
        {"state": "ABORTED", "wave": 1, "reason": "p95 latency 35 ms > SLO 10 ms"},
    ]
    events: list[tuple[str, dict]] = []
    last = fleet_service.follow_deployment(
        _ScriptedService(script), "d", lambda event, info: events.append((event, info)), timeout_s=30
    )
    assert last["state"] == "ABORTED"
    assert events == [
        ("wave_started", {"wave": 0}),
        ("wave_started", {"wave": 1}),
        ("aborted", {"wave": 1, "reason": "p95 latency 35 ms > SLO 10 ms"}),
        ("finished", {"state": "ABORTED"}),
    ]


def test_follow_deployment_gives_up_on_a_deployment_that_never_ends(monkeypatch) -> None:
    from edgesdk.demo import fleet_service
    from edgesdk.errors import FleetServiceError

    monkeypatch.setattr(fleet_service, "_POLL_S", 0.01)
    stuck = _ScriptedService([{"state": "IN_PROGRESS", "wave": 0, "reason": ""}])
    with pytest.raises(FleetServiceError, match="still IN_PROGRESS"):
        fleet_service.follow_deployment(stuck, "d", lambda *_: None, timeout_s=0.1)


def test_waves_groups_device_ids_by_wave_in_wave_order() -> None:
    from edgesdk.demo.story import _waves

    states = [{"device_id": "c", "wave": 1}, {"device_id": "a", "wave": 0}, {"device_id": "b", "wave": 1}]
    assert _waves(states) == [["a"], ["b", "c"]]
    assert _waves([]) == []
