"""What every handler of the REST API is given: the service's parts (``ApiContext``, kept on
the app as ``app.state.api_context``) and the operator whose token the route's check accepted.
Handlers are module-level functions; they ask for these two through FastAPI dependencies
(``Depends(api_context)``, ``Depends(signed_in)``), which add nothing to the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fastapi import Request

from edgesdk.fleet.service import tokens
from edgesdk.fleet.service.store import SqlRolloutStore


class RolloutCommands(Protocol):
    """What the API asks of the rollout controller (it signs and publishes)."""

    def abort(self, deployment_id: str, reason: str = ..., *, ttl_s: float | None = None) -> None: ...
    def rollback(self, deployment_id: str, reason: str = ..., *, ttl_s: float | None = None) -> int: ...


@dataclass(frozen=True)
class ApiContext:
    engine: Any
    store: SqlRolloutStore
    commands: RolloutCommands
    data_dir: Path
    registry_path: Path | None = None
    max_bundle_bytes: int = 2 << 30
    #: The file of a bundle a running rollout serves, by sha256 (``/artifacts/<sha256>.edgepkg``).
    artifacts: Callable[[str], Path | None] | None = None
    #: Where operators reach the dashboard (``--public-url``); https makes its cookies ``Secure``.
    public_url: str | None = None
    #: The broker's device password file (``broker_credentials``): a decommissioned device's
    #: line is removed from it. None: the service issues no broker passwords.
    device_passwords: Path | None = None
    #: The service's broker connection (``FleetService.broker_status``): ``/healthz``, the
    #: dashboard's banner and its "unknown since" presence read it; None: not known (no banner).
    broker_status: Callable[[], Any] | None = None


def api_context(request: Request) -> ApiContext:
    """A dependency: the context of the app the request reached."""
    context: ApiContext = request.app.state.api_context
    return context


def signed_in(request: Request) -> tokens.Operator:
    """A dependency: the operator the route's token check (``routing.authorize``) accepted; it
    runs first, as a dependency of the route itself."""
    operator: tokens.Operator = request.state.operator
    return operator
