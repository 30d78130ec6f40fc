"""`fleet serve` makes its files private (umask 077) only while it runs: a program that runs the
CLI in its own process gets its own umask back (a venv made later under 077 was unreadable to
the agent's user in a test run that had called `fleet serve token create` in process)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("sqlalchemy", reason="the fleet service is part of the fleet extra")


def test_fleet_serve_token_create_writes_private_files_and_gives_the_callers_umask_back(tmp_path: Path) -> None:
    from edgesdk.cli.main import cli

    data = tmp_path / "data"
    before = os.umask(0o022)
    try:
        made = CliRunner().invoke(
            cli, ["fleet", "serve", "token", "create", "--role", "viewer", "--name", "ana", "--data-dir", str(data)]
        )
        after = os.umask(0o022)
    finally:
        os.umask(before)
    assert made.exit_code == 0, made.output
    assert after == 0o022, oct(after)  # the caller's umask, not the service's 077
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = [p for p in data.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), {
        str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
    }
