"""Tables piped into another program keep every cell whole on one line (edgesdk/cli/output.py):
rich assumes 80 columns off a terminal and used to fold names mid-word (``onnx-fp3`` / ``2``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest


def _piped(*args: str, columns: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    # capture_output: stdout is a pipe, as in `edgesdk profiles list | cat`.
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def _cells(stdout: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in stdout.splitlines() if line.startswith("│")]


@pytest.mark.parametrize("columns", [None, "40"], ids=["no-COLUMNS", "COLUMNS=40"])
def test_profiles_list_piped_shows_every_name_whole(columns: str | None) -> None:
    listed = _piped("-m", "edgesdk.cli.main", "profiles", "list", "--json")
    names = [p["name"] for p in json.loads(listed.stdout)]
    proc = _piped("-m", "edgesdk.cli.main", "profiles", "list", columns=columns)
    assert proc.returncode == 0, proc.stderr
    rows = _cells(proc.stdout)
    assert [row[0] for row in rows] == names, proc.stdout  # one line per profile, its name whole
    assert any(len(line) > 80 for line in proc.stdout.splitlines()), "the table fits 80 columns: no test of width"


def test_print_table_piped_keeps_a_long_cell_whole() -> None:
    long_name = "a-variant-name-" + "x" * 100
    script = (
        "from edgesdk.cli.output import print_table; "
        f"print_table('variants', ['variant', 'runtime', 'note'], [[{long_name!r}, 'onnxruntime', 'a b c d e f']])"
    )
    proc = _piped("-c", script, columns="60")
    assert proc.returncode == 0, proc.stderr
    assert _cells(proc.stdout) == [[long_name, "onnxruntime", "a b c d e f"]], proc.stdout
    assert not re.search(r"\x1b\[", proc.stdout), "no terminal escapes in a pipe"
