"""What every route of the REST API shares: the error answers it documents (problem+json),
its paging (``limit``, ``offset``; ``{items, total, limit, offset}``) and audited work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Query

from edgesdk.fleet.service import audit, tokens
from edgesdk.fleet.service.rest import problems
from edgesdk.fleet.service.rest.schemas import Problem

#: The errors each kind of route documents (all application/problem+json).
READ_ERRORS = (401, 403, 422)
ONE_ERRORS = (401, 403, 404, 422)
WRITE_ERRORS = (401, 403, 404, 409, 422)
#: Most items one page holds; ``limit`` defaults to DEFAULT_LIMIT.
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100


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
