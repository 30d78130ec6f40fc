"""The headers every HTTP answer of the fleet service carries, whatever route made it.

* ``Content-Security-Policy``: nothing loads from anywhere but this origin; scripts run only
  when their text is one of the dashboard's own (by SHA-256 hash, so no inline handler and no
  injected ``<script>`` runs); no plugin, no ``<base>``, forms post only here, and no other site
  may frame a page (``frame-ancestors 'none'``, with ``X-Frame-Options: DENY`` for old browsers).
* ``X-Content-Type-Options: nosniff``: a bundle or JSON answer is never run as a script.
* ``Referrer-Policy: no-referrer``: page addresses (deployment ids) do not leak to links.
* ``Cache-Control: no-store`` on HTML pages: a shared machine's back button shows no fleet.

A pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``): streamed uploads and file
answers pass through untouched; only the ``http.response.start`` message gains headers.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from typing import Any


def script_hash(script: str) -> str:
    """The CSP source (``'sha256-…'``) that allows exactly this inline script text."""
    digest = hashlib.sha256(script.encode()).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


def content_security_policy(scripts: Iterable[str]) -> str:
    """The policy: the given inline scripts (their text between the tags) and nothing else."""
    allowed = " ".join(script_hash(s) for s in scripts) or "'none'"
    return (
        "default-src 'none'; "
        f"script-src {allowed}; "
        "style-src 'self' 'unsafe-inline'; "  # the page's <style> and the charts' SVG attributes
        "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
        "base-uri 'none'; object-src 'none'; frame-ancestors 'none'"
    )


class SecurityHeaders:
    """ASGI middleware adding the headers above to every HTTP response of ``app``."""

    def __init__(self, app: Any, *, policy: str) -> None:
        self.app = app
        self.headers = [
            (b"content-security-policy", policy.encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"no-referrer"),
            (b"cross-origin-opener-policy", b"same-origin"),
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(n, v) for n, v in self.headers if n not in present]
                content_type = next((v for n, v in message.get("headers", []) if n.lower() == b"content-type"), b"")
                if content_type.startswith(b"text/html") and b"cache-control" not in present:
                    extra.append((b"cache-control", b"no-store"))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
