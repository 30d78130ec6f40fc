"""What every dashboard page module needs from ``dashboard.add_dashboard``: the page frame,
who is signed in, the write check (session, CSRF, role, audited refusals) and the form parser."""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
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
