"""What every route of the REST API shares: the table that declares it (``Route``) and the one
function that registers a table (``add_routes``), the token check (``authorize``), the error
answers it documents (problem+json), its paging (``limit``, ``offset``; ``{items, total, limit,
offset}``), the handlers' preamble (the row a path names, or 404) and audited work."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from edgesdk.fleet.service import audit, tokens
from edgesdk.fleet.service.database import Transaction
from edgesdk.fleet.service.rest import problems
from edgesdk.fleet.service.rest.schemas import Problem

#: The errors each kind of route documents (all application/problem+json).
READ_ERRORS = (401, 403, 422)
ONE_ERRORS = (401, 403, 404, 422)
WRITE_ERRORS = (401, 403, 404, 409, 422)
#: Most items one page holds; ``limit`` defaults to DEFAULT_LIMIT.
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100


_Found = TypeVar("_Found")

_bearer = HTTPBearer(auto_error=False, description="an operator token: edgesdk fleet serve token create")

MISSING_TOKEN = "no operator token: send Authorization: Bearer <token> (edgesdk fleet serve token create)"


@dataclass(frozen=True)
class Route:
    """One route as its part's table declares it: method, path, handler, the role its token
    needs (None: no token, for devices and probes) and its audit action, the answer's model and
    the errors it documents."""

    method: str
    path: str
    handler: Callable[..., Any]
    role: tokens.Role | None
    #: The audit log's name for it (refusals included), e.g. ``deployment.create``.
    action: str
    model: Any = None
    #: The problem+json errors it documents; ``responses`` replaces them where set.
    errors: tuple[int, ...] = ()
    responses: Mapping[int | str, Any] | None = None
    status: int | None = None
    #: Further ``add_api_route`` arguments (``response_class``, ``operation_id``, ``openapi_extra``).
    options: Mapping[str, Any] = field(default_factory=dict)


class RouteTable:
    """The routes of one part of the API, in order, under its tag in the OpenAPI document."""

    def __init__(self, tag: str, *routes: Route) -> None:
        self.tag = tag
        self.routes = routes


def add_routes(app: FastAPI, table: RouteTable) -> None:
    """Register the table's routes in order, each behind its token check (the first dependency
    to run, so a request without a good token is refused before its parameters are read)."""
    for route in table.routes:
        extra: dict[str, Any] = dict(route.options)
        if route.model is not None:
            extra["response_model"] = route.model
        if route.status is not None:
            extra["status_code"] = route.status
        checks = [] if route.role is None else [Depends(authorize(route.role, route.action))]
        app.add_api_route(
            route.path,
            route.handler,
            methods=[route.method],
            tags=[table.tag],
            responses=dict(route.responses if route.responses is not None else documented(*route.errors)),
            dependencies=checks,
            **extra,
        )


def authorize(needed: tokens.Role, action: str) -> Callable[..., tokens.Operator]:
    """A dependency: the operator behind the token; 401 (missing or bad token, each its own
    message) or 403 otherwise. Refused writes reach the audit log through the error handler."""

    def check(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> tokens.Operator:
        request.state.action = action
        if credentials is None:
            raise HTTPException(401, MISSING_TOKEN, headers={"WWW-Authenticate": "Bearer"})
        operator, why = tokens.identify(request.app.state.api_context.engine, credentials.credentials)
        if operator is None:
            raise HTTPException(401, why, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        request.state.operator = operator
        if not tokens.allows(operator.role, needed):
            raise HTTPException(403, f"{action} needs the {needed} role; token {operator.token_id} is {operator.role}")
        return operator

    return check


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route: each status as problem+json."""
    return {
        status: {
            "model": Problem,
            "content": {problems.MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


@dataclass(frozen=True)
class Paging:
    limit: int
    offset: int

    def page(self, items: list[Any], total: int | None = None, *, sliced: bool = False) -> dict[str, Any]:
        """The page of ``items`` (all of them, or already this page when ``sliced``)."""
        shown = items if sliced else items[self.offset : self.offset + self.limit]
        return {
            "items": shown,
            "total": len(items) if total is None else total,
            "limit": self.limit,
            "offset": self.offset,
        }


def paging(
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=f"items per page, 1 to {MAX_LIMIT}"),
    offset: int = Query(0, ge=0, le=1 << 31, description="items to skip"),
) -> Paging:
    return Paging(limit, offset)


def audited_call(engine: Any, operator: tokens.Operator, action: str, target: str, work: Any, **detail: Any) -> Any:
    """``work()`` in the audit log as ``operator``'s ``action`` on ``target`` (ok, or failed)."""
    return audit.audited(engine, operator, action, target, work, detail)


def found_or_404(found: _Found | None, missing: str) -> _Found:
    """``found`` (what a handler looked up for its path), or a 404 saying ``missing``: what is
    not there and where to look."""
    if found is None:
        raise HTTPException(404, missing)
    return found


def row_or_404(engine: Any, table: sa.Table, column: Any, key: Any, missing: str) -> Any:
    """The row of ``table`` whose ``column`` is ``key``, or a 404 saying ``missing``."""
    with Transaction(engine) as db:
        row = db.execute(sa.select(table).where(column == key)).first()
    return found_or_404(row, missing)


def audited_replace(
    engine: Any,
    operator: tokens.Operator,
    action: str,
    table: sa.Table,
    column: Any,
    key: Any,
    values: Mapping[str, Any] | None,
    **detail: Any,
) -> None:
    """``table``'s row whose ``column`` is ``key`` replaced by ``values`` (None: deleted), in one
    transaction, in the audit log as ``operator``'s ``action`` on ``key``."""

    def work() -> None:
        with Transaction(engine) as db:
            db.execute(table.delete().where(column == key))
            if values is not None:
                db.execute(table.insert().values(**values))

    audited_call(engine, operator, action, key, work, **detail)
