"""Shared CLI output: rich tables for people, ``--json`` for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str, sort_keys=False))


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    console().print(table)


def profiles_dirs(ctx: click.Context) -> list[str]:
    """The ``--profiles-dir`` values given to the top-level command."""
    root = ctx.find_root()
    return list((root.obj or {}).get("profiles_dirs", []))
