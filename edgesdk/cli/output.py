"""Shared CLI output: rich tables for people, ``--json`` for scripts.

On a terminal a table fits the window and a cell too wide for its column folds inside it.
Piped or redirected there is no window: rich would assume 80 columns and fold names mid-word
(``onnx-fp3`` / ``2``), so there every cell stays whole on one line and the table is as wide
as it needs to be, for ``grep``, ``awk`` and ``cut`` to read whole names.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")

# Wide enough that measuring a table never squeezes it: its natural width is what comes back.
_UNBOUNDED = 1_000_000


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str, sort_keys=False))


def make_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, whole_cells: bool) -> Table:
    """The one table shape of the CLI; ``whole_cells`` (when piped) keeps every cell on one line."""
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=whole_cells)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    return table


def fit_when_piped(out: Console, table: Table) -> None:
    """Off a terminal, widen ``out`` to the table's natural width (never narrower than it was:
    ``COLUMNS`` or rich's 80), so that no cell is folded or cut."""
    if not out.is_terminal:
        natural = out.measure(table, options=out.options.update_width(_UNBOUNDED)).maximum
        out.width = max(out.width, natural)


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    out = console()
    table = make_table(title, columns, rows, whole_cells=not out.is_terminal)
    fit_when_piped(out, table)
    out.print(table)


#: A progress line written off a terminal: ``[  12.3 s] [3/5] onnx-int8 (...): converting, 3 of 7``.
#: Whatever follows it (an ``error: ...`` line) is still one line of its own.
PROGRESS_LINE = re.compile(r"^\[ *\d+\.\d s\] ")


class ProgressLines:
    """Progress as plain lines on stderr, one per step as it starts, each with the seconds since
    the command began. For a stderr that is no terminal (a pipe, a file, CI), where a live bar
    shows nothing until the end: a long conversion would look hung."""

    def __init__(self) -> None:
        self._started = time.monotonic()

    def __call__(self, text: str) -> None:
        click.echo(f"[{time.monotonic() - self._started:6.1f} s] {text}", err=True)  # echo flushes


def profiles_dirs(ctx: click.Context) -> list[str]:
    """The ``--profiles-dir`` values given to the top-level command."""
    root = ctx.find_root()
    return list((root.obj or {}).get("profiles_dirs", []))
