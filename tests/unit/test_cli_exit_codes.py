"""One exit-status rule for both commands, as the docs state it: 2 for a usage error (the
command line itself is wrong), 1 for every other error (edgesdk/cli/main.py, ``run_cli``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    # No EDGESDK_AGENT* from the caller's shell: "no configuration" must be what the agent sees.
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGESDK_AGENT")}
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=120, cwd=REPO
    )


@pytest.mark.parametrize(
    ("module", "args", "status", "needle"),
    [
        ("edgesdk.cli.main", ("profiles", "list", "--colour"), 2, "--colour"),
        ("edgesdk.cli.main", ("frobnicate",), 2, "frobnicate"),
        ("edgesdk.cli.main", ("profiles", "show", "rpi9"), 1, "'rpi9'"),
        ("edgesdk.agent.cli", ("run", "--bogus"), 2, "--bogus"),
        ("edgesdk.agent.cli", ("key",), 2, "--config"),
        ("edgesdk.agent.cli", ("key", "--config", "/nonexistent/agent.toml"), 1, "/nonexistent/agent.toml"),
    ],
    ids=["edgesdk-option", "edgesdk-command", "edgesdk-profile", "agent-option", "agent-no-config", "agent-no-file"],
)
def test_usage_errors_exit_2_other_errors_exit_1(module: str, args: tuple[str, ...], status: int, needle: str) -> None:
    proc = _run(module, *args)
    assert_one_line_error(proc, needle)
    assert proc.returncode == status, (proc.returncode, proc.stderr)


@pytest.mark.parametrize("module", ["edgesdk.cli.main", "edgesdk.agent.cli"])
def test_no_command_shows_the_help_not_an_error_line(module: str) -> None:
    proc = _run(module)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Usage: "), proc.stderr[:200]
    assert "error:" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("doc", ["docs/agent.md", "README.md"])
def test_the_docs_state_the_rule_the_commands_follow(doc: str) -> None:
    text = " ".join((REPO / doc).read_text(encoding="utf-8").split())
    assert "2 for a usage error" in text, doc
    assert not re.search(r"exit status 1\.", text), f"{doc} still promises exit status 1 for every error"
