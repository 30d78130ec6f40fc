"""What ``edgesdk demo`` prints around the story: a failed step (its one-line error, the end of
the failed process's log, the kept work dir) and the summary's serving variant on a device the
heat holds stepped down (edgesdk issue 36)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from edgesdk.cli.demo_cmd import _print_summary, failure_report
from edgesdk.demo.story import DemoError


def write_log(path: Path, lines: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"log line {n}\n" for n in range(1, lines + 1)))
    return path


def test_failure_report_is_the_error_then_the_logs_last_lines_then_the_kept_dir(tmp_path: Path) -> None:
    log = write_log(tmp_path / "fleet" / "service.log", 30)
    error = DemoError(f"the fleet service exited with status 1; see {log}", log_file=log)
    lines = failure_report(error, tmp_path).splitlines()
    assert lines[0] == f"error: the fleet service exited with status 1; see {log}"
    assert lines[1] == f"  last 20 lines of {log}:"
    assert [line.strip() for line in lines[2:22]] == [f"log line {n}" for n in range(11, 31)]
    assert lines[22:] == [f"work dir kept: {tmp_path}"]


def test_failure_report_without_a_log_or_with_a_missing_one(tmp_path: Path) -> None:
    assert failure_report(DemoError("no enroll request from edge-2 within 60 s"), tmp_path).splitlines() == [
        "error: no enroll request from edge-2 within 60 s",
        f"work dir kept: {tmp_path}",
    ]
    gone = tmp_path / "devices" / "edge-1" / "agent.log"
    assert f"{gone} is empty or missing" in failure_report(DemoError("x", log_file=gone), tmp_path)


def test_a_failed_demo_keeps_its_temp_work_dir_and_shows_the_log(tmp_path: Path, monkeypatch) -> None:
    """Without --workdir the demo works in a temp dir it deletes at the end: not after a failure,
    whose explanation (every log) lives there."""
    for extra in ("fastapi", "matplotlib", "sqlalchemy", "torch"):  # `edgesdk demo` checks them first
        pytest.importorskip(extra, reason="the demo needs every extra (pip install 'edgesdk[all]')")
    from click.testing import CliRunner

    from edgesdk.cli.main import cli
    from edgesdk.demo import story

    def failing_run(demo: story.Demo) -> Any:
        log = write_log(demo.work / "devices" / "edge-2" / "agent.log", 25)
        raise DemoError(f"agent edge-2 exited with status 1; see {log}", log_file=log)

    monkeypatch.setattr(story.Demo, "run", failing_run)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = CliRunner().invoke(cli, ["demo", "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 1, result.output
    (work,) = tmp_path.glob("edgesdk-demo-*")
    log = work / "devices" / "edge-2" / "agent.log"
    assert log.is_file()  # kept
    error = result.stderr.splitlines()
    assert error[0] == f"error: agent edge-2 exited with status 1; see {log}"
    assert error[-1] == f"work dir kept: {work}"
    assert "log line 25" in error[-2] and "log line 5" not in result.stderr


def device_row(device_id: str, variant: str, governor: str, temperature_c: float) -> dict[str, Any]:
    return {
        "device_id": device_id,
        "release": 2,
        "version": "1.1.0",
        "variant": variant,
        "precisions_used": ["fp32", "fp16", "int8"] if device_id == "edge-1" else ["fp32"],
        "requests": 100,
        "failed_requests": 0,
        "accuracy": 0.99,
        "client_p95_ms": 0.5,
        "governor": governor,
        "temperature_c": temperature_c,
    }


def test_the_summary_says_why_the_hot_device_ends_stepped_down(capsys, monkeypatch) -> None:
    """The hot device's heat waves repeat, so the demo may end in a later one: the summary's
    'onnx-int8' right after the story's 'back up to fp32' must say it is heat, now."""
    monkeypatch.setenv("COLUMNS", "250")  # one table row per device, not wrapped
    summary = {
        "profile": "rpi5-8gb",
        "wall_s": 64.0,
        "devices": [
            device_row("edge-1", "onnx-int8", "STEPPED_DOWN", 78.0),
            device_row("edge-2", "onnx-fp32", "NOMINAL", 55.0),
        ],
        "rollouts": [],
        "heat": {
            "device": "edge-1",
            "top": "fp32",
            "lowest_precision": "int8",
            "stepped_down_at_s": 29.3,
            "back_up_at_s": 43.3,
            "max_temperature_c": 78.0,
            "repeats_every_s": 32.0,
        },
        "reports": {"conversion": "c.html", "fleet": "f.html"},
    }
    _print_summary(summary, work_dir_kept=False)
    out = capsys.readouterr().out
    (edge1,) = [line for line in out.splitlines() if "edge-1" in line and "onnx-int8" in line]
    assert "onnx-int8 (stepped down at 78 °C)" in edge1
    (edge2,) = [line for line in out.splitlines() if "edge-2" in line]
    assert "onnx-fp32" in edge2 and "stepped down" not in edge2
    assert (
        "heat wave:         edge-1 stepped down to int8 at 29 s and back up to fp32 at 43 s "
        "(its sensor trace repeats the wave every 32 s until the demo ends)"
    ) in out
