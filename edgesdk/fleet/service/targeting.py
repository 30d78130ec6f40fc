"""Server-side device tags and dynamic groups: which devices a ``where`` expression selects.

The grammar is small on purpose (documented in docs/fleet-service.md, "Tags and dynamic groups")::

    expression := condition ( "and" condition )*
    condition  := field ( "=" | "!=" ) value
    field      := "tag." KEY | "profile" | "model" | "version" | "group"
    value      := a bare word of letters, digits and . _ : / + - , or a 'single-quoted' string

``tag.site=berlin and profile=pi5`` selects the devices whose operator-set tag ``site`` is
``berlin`` and whose announced profile is ``pi5``; ``group=x`` is a static group the device
announced. A device without the field (no such tag, no model) never equals a value and always
differs from one. Parsing is strict: anything else is a ``TargetError`` naming the bad token and
its position. A saved expression (a target filter) is resolved when the rollout is created,
like hawkBit's target filters: a device tagged later does not join a rollout already made.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from edgesdk.errors import UsageError
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction

FIELDS = ("profile", "model", "version", "group")
#: A tag key (and a filter name): what fits a URL path segment without escaping.
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_TOKEN = re.compile(r"\s*(?:(?P<op>!=|=)|'(?P<quoted>[^']*)'|(?P<word>[A-Za-z0-9_.:/+,-]+)|(?P<bad>\S))")


class TargetError(UsageError):
    """A ``where`` expression that does not parse, or a filter that is not there."""


@dataclass(frozen=True)
class Condition:
    field: str  # "tag.<key>" or one of FIELDS
    equal: bool
    value: str


def parse(expression: str) -> list[Condition]:
    """The conditions of ``expression`` (all must hold), or a ``TargetError`` naming the bad token."""
    tokens = _tokens(expression)
    if not tokens:
        raise TargetError("empty filter: write e.g. tag.site=berlin and profile=pi5")
    conditions = []
    index = 0
    while True:
        conditions.append(_condition(tokens, index, expression))
        index += 3
        if index == len(tokens):
            return conditions
        kind, text, where = tokens[index]
        if kind != "word" or text != "and":
            raise TargetError(f"expected 'and' at {where} in {expression!r}, found {text!r}")
        index += 1
        if index == len(tokens):
            raise TargetError(f"nothing after 'and' at the end of {expression!r}")


def _tokens(expression: str) -> list[tuple[str, str, int]]:
    found = []
    position = 0
    stripped = expression.rstrip()
    while position < len(stripped):
        match = _TOKEN.match(stripped, position)
        assert match is not None  # noqa: S101 - the pattern ends in a catch-all
        kind = match.lastgroup or "bad"
        text = match.group(kind)
        if kind == "bad":
            raise TargetError(
                f"unexpected {text!r} at {match.start(kind)} in {expression!r}: values are words or 'quoted'"
            )
        found.append((kind, text, match.start(kind)))
        position = match.end()
    return found


def _condition(tokens: list[tuple[str, str, int]], index: int, expression: str) -> Condition:
    if index + 3 > len(tokens):
        rest = " ".join(t[1] for t in tokens[index:])
        raise TargetError(f"incomplete condition {rest!r} in {expression!r}: write field=value or field!=value")
    (field_kind, field, at), (op_kind, op, op_at), (value_kind, value, value_at) = tokens[index : index + 3]
    if field_kind != "word" or not (field in FIELDS or re.match(r"^tag\.[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", field)):
        raise TargetError(f"unknown field {field!r} at {at} in {expression!r}: use tag.KEY, {', '.join(FIELDS)}")
    if op_kind != "op":
        raise TargetError(f"expected = or != at {op_at} in {expression!r}, found {op!r}")
    if value_kind not in ("word", "quoted"):
        raise TargetError(f"expected a value at {value_at} in {expression!r}, found {value!r}")
    return Condition(field, op == "=", value)


def matches(conditions: list[Condition], device: dict[str, Any]) -> bool:
    """Whether ``device`` (its fields, ``groups`` a list, ``tags`` a dict) meets every condition."""
    for condition in conditions:
        if condition.field == "group":
            present = condition.value in device.get("groups", [])
        else:
            if condition.field.startswith("tag."):
                actual = device.get("tags", {}).get(condition.field[4:])
            else:
                actual = device.get(condition.field)
            present = actual is not None and str(actual) == condition.value
        if present != condition.equal:
            return False
    return True


def select_devices(engine: Any, expression: str) -> list[str]:
    """The ids of the known devices ``expression`` selects, sorted."""
    conditions = parse(expression)
    tags = all_tags(engine)
    d = schema.devices
    with Transaction(engine) as db:
        rows = db.execute(sa.select(d.c.device_id, d.c.profile, d.c.model_name, d.c.model_version, d.c.groups)).all()
    return sorted(
        r.device_id
        for r in rows
        if matches(
            conditions,
            {
                "profile": r.profile,
                "model": r.model_name,
                "version": r.model_version,
                "groups": json.loads(r.groups or "[]"),
                "tags": tags.get(r.device_id, {}),
            },
        )
    )


def all_tags(engine: Any) -> dict[str, dict[str, str]]:
    t = schema.device_tags
    with Transaction(engine) as db:
        rows = db.execute(sa.select(t.c.device_id, t.c.key, t.c.value)).all()
    found: dict[str, dict[str, str]] = {}
    for row in rows:
        found.setdefault(row.device_id, {})[row.key] = row.value
    return found


def device_tags(engine: Any, device_id: str) -> dict[str, str]:
    t = schema.device_tags
    with Transaction(engine) as db:
        rows = db.execute(sa.select(t.c.key, t.c.value).where(t.c.device_id == device_id)).all()
    return {r.key: r.value for r in sorted(rows)}


def set_tag(engine: Any, device_id: str, key: str, value: str) -> None:
    t = schema.device_tags
    with Transaction(engine) as db:
        db.execute(t.delete().where((t.c.device_id == device_id) & (t.c.key == key)))
        db.execute(t.insert().values(device_id=device_id, key=key, value=value, updated=time.time()))


def delete_tag(engine: Any, device_id: str, key: str) -> bool:
    t = schema.device_tags
    with Transaction(engine) as db:
        return bool(db.execute(t.delete().where((t.c.device_id == device_id) & (t.c.key == key))).rowcount)


def saved_filter(engine: Any, name: str) -> str:
    """The expression saved as ``name``, or a ``TargetError`` naming it."""
    f = schema.target_filters
    with Transaction(engine) as db:
        query = db.execute(sa.select(f.c.query).where(f.c.name == name)).scalar()
    if query is None:
        raise TargetError(f"no target filter {name!r}: save one with PUT /api/v1/target-filters/{name}")
    return str(query)
