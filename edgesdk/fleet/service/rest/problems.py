"""One error shape for every refusal of the REST API: RFC 9457 ``application/problem+json``.

``{type, title, status, detail, instance}``, and ``errors`` for a 422 (one ``{field, message,
value}`` per bad input): whatever refused the request — a route (``HTTPException``), the
request's validation, an ``EdgeSDKError`` from below, or a bug (a 500 that names no internals;
the traceback goes to the service's log). Every refused write (a method other than GET/HEAD)
is also written to the audit log, with who asked when the token was good (``on_refused``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edgesdk.errors import EdgeSDKError, EnrollmentError, FleetServiceError

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"

#: Called for every refused write: (request, status, detail).
OnRefused = Callable[[Request, int, str], None]


def problem(
    request: Request,
    status: int,
    detail: str,
    *,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The problem+json answer: ``type`` is ``about:blank`` (the status says it all), ``title``
    the status's phrase, ``instance`` the path that was asked."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": _phrase(status),
        "status": status,
        "detail": detail,
        "instance": request.url.path,
    }
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, headers=headers, media_type=MEDIA_TYPE)


def field_errors(errors: Any) -> list[dict[str, Any]]:
    """pydantic's errors as ``{field, message, value}``: the field dotted (``body.expires_s``),
    the bad value JSON-safe (a NaN, which Python's JSON parser reads, as its text)."""
    found = []
    for error in jsonable_encoder(errors):
        entry = {"field": ".".join(str(part) for part in error.get("loc", ())), "message": error.get("msg", "")}
        if "input" in error:
            entry["value"] = _json_safe(error["input"])
        found.append(entry)
    return found


def status_of(exc: EdgeSDKError) -> int:
    """What an error from below the API means to a client: a conflict with the enrollment
    state (409), the service unable to act (503), or bad input (400)."""
    if isinstance(exc, EnrollmentError):
        return 409
    return 503 if isinstance(exc, FleetServiceError) else 400


def install(app: FastAPI, on_refused: OnRefused) -> None:
    """Answer every error of ``app`` as problem+json, and report each refused write."""

    def answer(request: Request, status: int, detail: str, **kw: Any) -> JSONResponse:
        write = request.method not in ("GET", "HEAD", "OPTIONS")
        if write and 400 <= status < 500 and request.url.path.startswith("/api/"):  # the dashboard audits its own
            on_refused(request, status, detail)
        return problem(request, status, detail, **kw)

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return answer(request, exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = field_errors(exc.errors())
        first = errors[0] if errors else {"field": "request", "message": "invalid"}
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return answer(request, 422, f"{first['field']}: {first['message']}{more}", errors=errors)

    @app.exception_handler(EdgeSDKError)
    def _edgesdk(request: Request, exc: EdgeSDKError) -> JSONResponse:
        status = status_of(exc)
        if status == 503 or getattr(exc, "edgesdk_audited", False):
            return problem(request, status, str(exc))  # already in the audit log as failed
        return answer(request, status, str(exc))

    @app.exception_handler(Exception)
    def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("API %s %s failed", request.method, request.url.path, exc_info=exc)
        # Answered outside the app's middleware (Starlette's outermost error layer): the security
        # headers every other answer gets from web_security are set here.
        return problem(
            request, 500, "the fleet service failed on this request; its log has the details", headers=_BARE_HEADERS
        )


_BARE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as its text (``"nan"``, ``"inf"``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value
