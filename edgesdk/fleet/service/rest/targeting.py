"""The REST API's server-side device tags, dynamic groups (saved target filters) and groups'
maintenance windows (issue 40). Tags and filters are the operator's, never the device's; a
filter, like a group's window, is read when a rollout is created (``targeting``, ``schedule``).
The webhooks' routes are in ``rest.webhooks``."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from fastapi import Depends, HTTPException, Path
from pydantic import BaseModel, ConfigDict, Field

from edgesdk.errors import UsageError
from edgesdk.fleet import schedule
from edgesdk.fleet.service import schema, targeting, tokens
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.rest.context import ApiContext, api_context, signed_in
from edgesdk.fleet.service.rest.routing import (
    ONE_ERRORS,
    READ_ERRORS,
    WRITE_ERRORS,
    Paging,
    Route,
    RouteTable,
    audited_call,
    audited_replace,
    paging,
    row_or_404,
)
from edgesdk.fleet.service.rest.schemas import Page


def _key() -> Any:
    """A tag key or filter name in the path (a new FieldInfo each: FastAPI keeps one per parameter)."""
    return Path(pattern=targeting.KEY_PATTERN, description="letters, digits, . _ - (at most 64)")


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TagValue(_Body):
    value: str = Field(min_length=1, max_length=255)


class DeviceTags(BaseModel):
    device_id: str
    tags: dict[str, str]


class TargetFilterBody(_Body):
    where: str = Field(min_length=1, max_length=1000, description="e.g. tag.site=berlin and profile=pi5")


class TargetFilter(BaseModel):
    name: str
    where: str
    devices: list[str] = Field(description="the devices it selects now")


class WindowBody(_Body):
    window: str = Field(description="HH:MM-HH:MM in the devices' local time (22:00-04:00 wraps midnight)")
    window_tz: str | None = Field(None, max_length=64, description="IANA zone; default the service's")


class GroupWindow(BaseModel):
    group: str
    window: str
    window_tz: str | None


def get_tags(device_id: str, context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    _known_device(context.engine, device_id)
    return {"device_id": device_id, "tags": targeting.device_tags(context.engine, device_id)}


def put_tag(
    device_id: str,
    body: TagValue,
    key: str = _key(),
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    engine = context.engine
    _known_device(engine, device_id)
    audited_call(
        engine,
        operator,
        "device.tag",
        device_id,
        lambda: targeting.set_tag(engine, device_id, key, body.value),
        key=key,
        value=body.value,
    )
    return {"device_id": device_id, "tags": targeting.device_tags(engine, device_id)}


def delete_tag(
    device_id: str,
    key: str = _key(),
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    engine = context.engine
    _known_device(engine, device_id)
    if key not in targeting.device_tags(engine, device_id):
        raise HTTPException(404, f"device {device_id!r} has no tag {key!r}")
    audited_call(
        engine, operator, "device.untag", device_id, lambda: targeting.delete_tag(engine, device_id, key), key=key
    )
    return {"device_id": device_id, "tags": targeting.device_tags(engine, device_id)}


def list_filters(page: Paging = Depends(paging), context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    table = schema.target_filters
    with Transaction(context.engine) as db:
        rows = db.execute(sa.select(table).order_by(table.c.name)).all()
    return page.page([_filter(context.engine, r.name, r.query) for r in rows])


def get_filter(name: str = _key(), context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    return _filter(context.engine, name, _saved(context.engine, name))


def put_filter(
    body: TargetFilterBody,
    name: str = _key(),
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """Save (or replace) a dynamic group; 422 naming the bad token of ``where``."""
    try:
        targeting.parse(body.where)
    except targeting.TargetError as exc:
        raise HTTPException(422, str(exc)) from None
    table = schema.target_filters
    row = {"name": name, "query": body.where, "created": time.time(), "created_by": operator.actor}
    audited_replace(context.engine, operator, "target_filter.save", table, table.c.name, name, row, where=body.where)
    return _filter(context.engine, name, body.where)


def delete_filter(
    name: str = _key(),
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """The filter as it was (rollouts made from it keep their devices)."""
    removed = _filter(context.engine, name, _saved(context.engine, name))
    table = schema.target_filters
    audited_replace(context.engine, operator, "target_filter.delete", table, table.c.name, name, None)
    return removed


def list_windows(page: Paging = Depends(paging), context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    table = schema.maintenance_windows
    with Transaction(context.engine) as db:
        rows = db.execute(sa.select(table).order_by(table.c.group_name)).all()
    return page.page([{"group": r.group_name, "window": r.window, "window_tz": r.window_tz} for r in rows])


def get_window(group: str, context: ApiContext = Depends(api_context)) -> dict[str, Any]:
    return _known_window(context.engine, group)


def put_window(
    group: str,
    body: WindowBody,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    """The window a rollout to ``group`` takes when it names none (read when the rollout is created)."""
    try:
        schedule.parse_window(body.window, option="window")
        schedule.zone(body.window_tz, option="window_tz")
    except UsageError as exc:
        raise HTTPException(422, str(exc)) from None
    table = schema.maintenance_windows
    row = {"group_name": group, "window": body.window.strip(), "window_tz": body.window_tz, "updated": time.time()}
    audited_replace(
        context.engine,
        operator,
        "group.window",
        table,
        table.c.group_name,
        group,
        row,
        window=body.window,
        window_tz=body.window_tz,
    )
    return _known_window(context.engine, group)


def delete_window(
    group: str,
    operator: tokens.Operator = Depends(signed_in),
    context: ApiContext = Depends(api_context),
) -> dict[str, Any]:
    removed = _known_window(context.engine, group)
    table = schema.maintenance_windows
    audited_replace(context.engine, operator, "group.window_clear", table, table.c.group_name, group, None)
    return removed


_TAGS = "/api/v1/devices/{device_id}/tags"
_FILTERS = "/api/v1/target-filters"
_WINDOW = "/api/v1/groups/{group}/window"

ROUTES = RouteTable(
    "targeting",
    Route("GET", _TAGS, get_tags, "viewer", "devices.read", DeviceTags, ONE_ERRORS),
    Route("PUT", _TAGS + "/{key}", put_tag, "operator", "device.tag", DeviceTags, WRITE_ERRORS),
    Route("DELETE", _TAGS + "/{key}", delete_tag, "operator", "device.untag", DeviceTags, WRITE_ERRORS),
    Route("GET", _FILTERS, list_filters, "viewer", "target_filters.read", Page[TargetFilter], READ_ERRORS),
    Route("GET", _FILTERS + "/{name}", get_filter, "viewer", "target_filters.read", TargetFilter, ONE_ERRORS),
    Route("PUT", _FILTERS + "/{name}", put_filter, "operator", "target_filter.save", TargetFilter, WRITE_ERRORS),
    Route(
        "DELETE", _FILTERS + "/{name}", delete_filter, "operator", "target_filter.delete", TargetFilter, WRITE_ERRORS
    ),
    Route("GET", "/api/v1/group-windows", list_windows, "viewer", "devices.read", Page[GroupWindow], READ_ERRORS),
    Route("GET", _WINDOW, get_window, "viewer", "devices.read", GroupWindow, ONE_ERRORS),
    Route("PUT", _WINDOW, put_window, "operator", "group.window", GroupWindow, WRITE_ERRORS),
    Route("DELETE", _WINDOW, delete_window, "operator", "group.window_clear", GroupWindow, WRITE_ERRORS),
)


def _known_window(engine: Any, group: str) -> dict[str, Any]:
    table = schema.maintenance_windows
    missing = f"group {group!r} has no maintenance window (PUT /api/v1/groups/{group}/window)"
    row = row_or_404(engine, table, table.c.group_name, group, missing)
    return {"group": group, "window": row.window, "window_tz": row.window_tz}


def _known_device(engine: Any, device_id: str) -> None:
    d = schema.devices
    row_or_404(engine, d, d.c.device_id, device_id, f"device {device_id!r} not known to the fleet service")


def _saved(engine: Any, name: str) -> str:
    try:
        return targeting.saved_filter(engine, name)
    except targeting.TargetError as exc:
        raise HTTPException(404, str(exc)) from None


def _filter(engine: Any, name: str, where: str) -> dict[str, Any]:
    return {"name": name, "where": where, "devices": targeting.select_devices(engine, where)}


def resolve_target(engine: Any, filter_name: str | None, where: str | None) -> list[str]:
    """The devices a rollout to a saved filter (or a ``where``) goes to, resolved now; an
    HTTPException 404 for an unknown filter, 422 for a bad expression or one selecting nobody."""
    if filter_name is not None:
        try:
            where = targeting.saved_filter(engine, filter_name)
        except targeting.TargetError as exc:
            raise HTTPException(404, str(exc)) from None
    try:
        found = targeting.select_devices(engine, where or "")
    except targeting.TargetError as exc:
        raise HTTPException(422, str(exc)) from None
    if not found:
        raise HTTPException(422, f"no known device matches {where!r}; check the tags (GET /api/v1/target-filters)")
    return found
