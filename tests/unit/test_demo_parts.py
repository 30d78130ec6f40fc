"""The demo's own parts that need no broker or agent: metrics parsing, finding the heat
episode, the heat trace against the profile's thermal points, and the process set."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from edgesdk.demo.collector import Sample, parse_latency
from edgesdk.demo.processes import ProcessSet
from edgesdk.demo.story import find_step_down_and_up
from edgesdk.demo.traces import write_heat_trace, write_idle_trace
from edgesdk.profiles import get_profile

METRICS = """# HELP edgesdk_agent_inference_latency_seconds rolling latency quantiles over 60 s
# TYPE edgesdk_agent_inference_latency_seconds gauge
edgesdk_agent_inference_latency_seconds{variant="onnx-fp32",quantile="0.5"} 0.0004
edgesdk_agent_inference_latency_seconds{variant="onnx-fp32",quantile="0.95"} 0.0012
edgesdk_agent_inference_latency_seconds{variant="onnx-int8",quantile="0.95"} 0.002
edgesdk_agent_inferences_total{variant="onnx-fp32"} 12
"""


def test_parse_latency_reads_quantiles_per_variant_in_ms() -> None:
    parsed = parse_latency(METRICS)
    assert parsed == {
        "onnx-fp32": {"0.5": pytest.approx(0.4), "0.95": pytest.approx(1.2)},
        "onnx-int8": {"0.95": pytest.approx(2.0)},
    }
    assert parse_latency("") == {}


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
    deadline = time.monotonic() + 30
    while not (tmp_path / "grandchild.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int((tmp_path / "grandchild.pid").read_text())
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
