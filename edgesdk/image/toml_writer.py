"""A small TOML writer for configuration documents (nested tables of scalars and lists).

The standard library reads TOML (``tomllib``) but cannot write it, and the device agent's
config needs nothing beyond strings, numbers, booleans, lists and tables, so this avoids a
dependency. ``None`` values are left out: TOML has no null, and an absent key means "default".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else json.dumps(name)


def _value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: TOML config values must be finite, got {value!r}")
        return repr(value)
    if isinstance(value, str):
        # A JSON string with ASCII escapes is a valid TOML basic string.
        return json.dumps(value, ensure_ascii=True)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v, where) for v in value if v is not None) + "]"
    raise TypeError(f"{where}: cannot write {type(value).__name__} as a TOML value")


def dumps(document: Mapping[str, Any], *, header: str = "") -> str:
    """TOML text for ``document``; ``header`` lines become ``#`` comments at the top."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]

    def table(mapping: Mapping[str, Any], path: tuple[str, ...]) -> None:
        scalars = [(k, v) for k, v in mapping.items() if v is not None and not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in mapping.items() if isinstance(v, Mapping)]
        if path and (scalars or not tables):
            lines.append("")
            lines.append("[" + ".".join(_key(p) for p in path) + "]")
        for key, value in scalars:
            lines.append(f"{_key(key)} = {_value(value, '.'.join((*path, key)))}")
        for key, value in tables:
            table(value, (*path, key))

    table(document, ())
    return "\n".join(lines).lstrip("\n") + "\n"
