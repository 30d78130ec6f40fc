"""Fault injection is a seam the tests pass in, never a setting production code reads.

A variable such as the old ``EDGESDK_OTA_TEST_KILL_AT`` (SIGKILL the agent after a state is
saved) would be one stray line in a fleet's environment away from killing every device mid-update.
The faults now live in ``tests/faulty_agent.py`` and reach the updater through
``edgesdk.agent.ota.hooks.OtaHooks``; these tests keep it that way."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from edgesdk.agent.ota.hooks import NO_HOOKS, OtaHooks
from edgesdk.agent.ota.states import UpdateState

from tests.faulty_agent import FaultPlan, faulty_agent_argv

REPO = Path(__file__).resolve().parents[2]
PRODUCTION_ROOTS = ("agent", "edgesdk", "converters")
FAULT_SETTINGS = ("EDGESDK_OTA_TEST", "EDGESDK_OTA_FAULT")


def production_sources() -> list[Path]:
    files = [path for root in PRODUCTION_ROOTS for path in sorted((REPO / root).rglob("*.py"))]
    assert len(files) > 50, f"found only {len(files)} production modules under {PRODUCTION_ROOTS}"
    return files


def test_production_code_reads_no_fault_injection_setting() -> None:
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for path in production_sources()
        for name in FAULT_SETTINGS
        if name in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_the_updater_has_no_way_to_kill_its_own_process() -> None:
    for path in sorted((REPO / "agent" / "ota").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "SIGKILL" not in text and "os.kill" not in text, path.relative_to(REPO)


def test_the_default_hooks_do_nothing(tmp_path: Path) -> None:
    for state in UpdateState:
        NO_HOOKS.after_state_saved(state)
    NO_HOOKS.before_write("download", tmp_path / "x.part", 1 << 40)
    NO_HOOKS.before_write("stage", tmp_path, 1 << 40)


def test_fault_plan_fills_the_disk_only_where_asked(tmp_path: Path) -> None:
    plan = FaultPlan(disk_full={"stage"})
    assert isinstance(plan, OtaHooks)
    plan.before_write("download", tmp_path / "x.part", 10)
    with pytest.raises(OSError) as caught:
        plan.before_write("stage", tmp_path, 10)
    assert caught.value.errno == errno.ENOSPC
    plan.disk_full.clear()
    plan.before_write("stage", tmp_path, 10)


def test_fault_plan_command_line(tmp_path: Path) -> None:
    argv = faulty_agent_argv(tmp_path / "agent.toml", kill_at=UpdateState.STAGED, disk_full=("download",))
    assert argv[1:] == [
        "-m",
        "tests.faulty_agent",
        "--config",
        str(tmp_path / "agent.toml"),
        "--kill-at",
        "STAGED",
        "--disk-full",
        "download",
    ]
