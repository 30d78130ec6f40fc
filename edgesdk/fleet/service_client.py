"""A client of the fleet service's REST API for the CLI (stdlib HTTP: no extra dependency on
the operator's machine). ``edgesdk fleet push|status|abort|rollback|devices|enroll --server
URL`` go through it; without a server those commands keep working standalone.

The server and token come from ``--server``/``--token-file`` or ``$EDGESDK_FLEET_SERVER`` /
``$EDGESDK_FLEET_TOKEN``. Every failure is one :class:`~edgesdk.errors.FleetServiceError`
naming the server and what it answered.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from edgesdk.errors import FleetServiceError, UsageError

SERVER_ENV = "EDGESDK_FLEET_SERVER"
#: Items asked per request of a list (the server's most).
PAGE_SIZE = 1000
TOKEN_ENV = "EDGESDK_FLEET_TOKEN"


class ServiceClient:
    """Calls ``/api/v1`` of one fleet service with one operator token."""

    def __init__(self, server: str, token: str, *, timeout_s: float = 60.0) -> None:
        parts = urllib.parse.urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"bad --server {server!r}: expected http(s)://HOST:PORT")
        if not token:
            raise UsageError(f"--server {server} needs an operator token: --token-file FILE or ${TOKEN_ENV}")
        self.server = server.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None, **query: Any) -> Any:
        params = {k: v for k, v in query.items() if v is not None}
        url = f"{self.server}/api/v1{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json, application/problem+json"}
        data = raw
        if raw is not None:
            headers["Content-Type"] = "application/octet-stream"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise FleetServiceError(f"fleet service {self.server}: {exc.code} {_detail(exc)}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise FleetServiceError(f"cannot reach fleet service {self.server}: {reason}") from exc
        except ValueError as exc:
            raise FleetServiceError(f"fleet service {self.server} answered something that is not JSON") from exc

    # -- what the CLI asks ------------------------------------------------------------------

    def pages(self, path: str, **filters: Any) -> tuple[list[Any], int]:
        """Every item of a list endpoint, page after page, and the total the server counted."""
        items: list[Any] = []
        while True:
            page = self.call("GET", path, limit=PAGE_SIZE, offset=len(items), **filters)
            items += page["items"]
            if not page["items"] or len(items) >= page["total"]:
                return items, int(page["total"])

    def devices(self, **filters: Any) -> dict[str, Any]:
        devices, total = self.pages("/devices", **filters)
        return {"devices": devices, "total": total}

    def deployments(self) -> list[dict[str, Any]]:
        return self.pages("/deployments")[0]

    def deployment(self, deployment_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/deployments/{urllib.parse.quote(deployment_id)}"))

    def upload(self, bundle: Path) -> dict[str, Any]:
        if not bundle.is_file():
            raise UsageError(f"bundle file {str(bundle)!r} not found")
        return dict(self.call("POST", "/bundles", raw=bundle.read_bytes(), filename=bundle.name))

    def create(self, plan: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("POST", "/deployments", plan))

    def command(self, deployment_id: str, action: str, **options: Any) -> dict[str, Any]:
        body = {k: v for k, v in options.items() if v is not None}
        return dict(self.call("POST", f"/deployments/{urllib.parse.quote(deployment_id)}/{action}", body))

    def enrollment(self) -> list[dict[str, Any]]:
        return self.pages("/enrollment")[0]

    def decide(self, device_id: str, action: str, **options: Any) -> dict[str, Any]:
        return dict(self.call("POST", f"/enrollment/{urllib.parse.quote(device_id)}/{action}", options))


def _detail(exc: urllib.error.HTTPError) -> str:
    """The server's one line: ``detail`` of its problem+json answer (RFC 9457)."""
    try:
        detail = json.loads(exc.read()).get("detail")
    except (ValueError, OSError, AttributeError):
        return str(exc.reason)
    return str(detail) if detail else str(exc.reason)


def client_from(server: str | None, token_file: Path | None) -> ServiceClient | None:
    """The client the flags (or environment) name, or None for standalone commands."""
    import os

    server = server or os.environ.get(SERVER_ENV) or None
    if server is None:
        return None
    token = os.environ.get(TOKEN_ENV, "")
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {str(token_file)!r}: {exc.strerror or exc}") from exc
    return ServiceClient(server, token)
