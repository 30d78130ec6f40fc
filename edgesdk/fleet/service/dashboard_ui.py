"""What every dashboard page module needs from ``dashboard.add_dashboard``: the page frame,
who is signed in, the write check (session, CSRF, role, audited refusals) and the form parser;
and how a module mounts its route table of module-level handlers (``mount_pages``), which find
those parts on the app (``page_parts``)."""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from edgesdk.fleet.service import tokens


@dataclass(frozen=True)
class Ui:
    #: page(title, body, operator, *, refresh=True, status_code=200): the frame around a body.
    page: Callable[..., HTMLResponse]
    #: session(request) -> (operator or None, session id)
    session: Callable[[Request], tuple[tokens.Operator | None, str]]
    #: write_allowed(csrf, session id, operator, action, target) -> None, or why not (audited).
    write_allowed: Callable[[str, str, tokens.Operator | None, str, str], str | None]
    form: Callable[[Request], Awaitable[dict[str, str]]]
    login_redirect: Callable[[], RedirectResponse]
    csrf_for: Callable[[str], str]


@dataclass(frozen=True)
class PageParts:
    """What a page module's handlers use: the dashboard's ``Ui``, the API's context and the
    broker's status now (a callable, given where the pages show presence)."""

    ui: Ui
    context: Any
    broker: Callable[[], Any] = lambda: None  # noqa: E731 - pages without presence: no status


#: A page module's route table: (method, path, handler, response class; None: FastAPI's default).
Pages = tuple[tuple[str, str, Callable[..., Any], Any], ...]


def mount_pages(app: FastAPI, name: str, parts: PageParts, pages: Pages) -> None:
    """Register ``pages`` on ``app`` (none in the OpenAPI document); their handlers find ``parts``
    with ``page_parts(request, name)``."""
    setattr(app.state, name, parts)
    for method, path, handler, response_class in pages:
        chosen: dict[str, Any] = {} if response_class is None else {"response_class": response_class}
        app.add_api_route(path, handler, methods=[method], include_in_schema=False, **chosen)


def page_parts(request: Request, name: str) -> PageParts:
    """The parts ``mount_pages`` kept on the app under ``name``."""
    parts: PageParts = getattr(request.app.state, name)
    return parts


def escape(value: Any) -> str:
    """HTML text of a value (``-`` for None)."""
    return html.escape("-" if value is None else str(value))


_STATE_CLASS = {
    "COMMITTED": "ok",
    "SUCCEEDED": "ok",
    "FAILED": "bad",
    "ROLLED_BACK": "bad",
    "TIMED_OUT": "bad",
    "ABORTED": "bad",
    "PENDING": "idle",
}


def state_badge(value: Any) -> str:
    """A rollout or device state, coloured (good green, failed red, pending grey)."""
    return f'<span class="{_STATE_CLASS.get(str(value), "")}">{escape(value)}</span>'


def not_found(what: str, name: str) -> str:
    """The body of a 404 page: no such device, rollout or action."""
    return f'<section><h1>No {what} {escape(name)}</h1><p><a href="/">back to the overview</a></p></section>'
