"""The demo's fleet service: ``edgesdk fleet serve`` as one of the demo's children, and
rollouts handed to it over its REST API.

The service keeps its SQLite database in the work dir, serves the REST API and the dashboard on
an ephemeral loopback port, and signs deployments with the demo's operator key. The demo makes
an operator token for itself before the service starts (the database keeps only its hash; the
token is written 0600 next to the database) and then acts like any operator's script: upload a
bundle, create a deployment, read the deployment until it ends.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.demo.processes import ProcessSet
from edgesdk.errors import FleetServiceError
from edgesdk.fleet.deployments import FINISHED_ROLLOUT_STATES
from edgesdk.fleet.service_client import ServiceClient

#: The start-up line of ``edgesdk fleet serve`` carries the bound API address.
_API_LINE = re.compile(r"API on (http://\S+)")
#: How often the demo reads a running deployment (the service itself polls every 0.2 s).
_POLL_S = 0.25


@dataclass(frozen=True)
class DemoService:
    """Where the running service is and how the demo talks to it."""

    url: str  # the dashboard; the API is under /api/v1
    token_file: Path
    db_url: str
    log_file: Path
    client: ServiceClient


def edgesdk_command() -> list[str]:
    """``edgesdk`` from this environment (next to this Python), else ``python -m``."""
    script = Path(sys.executable).with_name("edgesdk")
    return [str(script)] if script.exists() else [sys.executable, "-m", "edgesdk.cli.main"]


def make_operator_token(data_dir: Path) -> tuple[str, Path]:
    """Create the service's database (migrated) with one operator token for the demo; returns
    (database URL, token file)."""
    from edgesdk.fleet.service.database import default_db_url, migrate, open_engine
    from edgesdk.fleet.service.tokens import create_token

    data_dir.mkdir(parents=True, exist_ok=True)
    db_url = default_db_url(data_dir)
    engine = open_engine(db_url)
    try:
        migrate(engine)
        _token_id, secret = create_token(engine, name="edgesdk-demo", role="operator", created_by="edgesdk demo")
    finally:
        engine.dispose()
    token_file = data_dir / "operator.token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    return db_url, token_file


def start_service(
    processes: ProcessSet, data_dir: Path, *, broker_url: str, operator_key: Path, namespace: str
) -> tuple[str, Path, Path]:
    """Start ``edgesdk fleet serve`` in ``processes`` (returns at once: see :func:`wait_service`);
    returns (database URL, token file, log file)."""
    db_url, token_file = make_operator_token(data_dir)
    log_file = data_dir / "service.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESDK_FLEET", "EDGESDK_BROKER"))}
    processes.start(
        "fleet-service",
        [
            *edgesdk_command(), "fleet", "serve",
            "--broker", broker_url, "--namespace", namespace,
            "--db", db_url, "--data-dir", str(data_dir), "--registry", str(data_dir / "enrollment.json"),
            "--operator-key", str(operator_key), "--api", "127.0.0.1:0",
            "--broker-wait", "10s",  # the demo's broker is up already: no minute of retries
        ],
        log_file=log_file,
        env=env,
    )  # fmt: skip
    return db_url, token_file, log_file


def wait_service(
    processes: ProcessSet, db_url: str, token_file: Path, log_file: Path, timeout_s: float = 90.0
) -> DemoService:
    """Wait for the service's start-up line (it is printed once the API listens)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        found = _API_LINE.search(text)
        if found:
            url = found.group(1).rstrip(",")
            client = ServiceClient(url, token_file.read_text().strip(), timeout_s=30.0)
            return DemoService(url=url, token_file=token_file, db_url=db_url, log_file=log_file, client=client)
        exited = processes.exited()
        if "fleet-service" in exited:
            raise FleetServiceError(f"the fleet service exited with status {exited['fleet-service']}; see {log_file}")
        if time.monotonic() > deadline:
            raise FleetServiceError(f"the fleet service did not open its API within {timeout_s:.0f} s; see {log_file}")
        time.sleep(0.1)


def wait_devices_known(service: DemoService, group: str, devices: set[str], timeout_s: float = 60.0) -> None:
    """Until the service has seen every device in ``devices`` announce ``group``."""
    deadline = time.monotonic() + timeout_s
    while True:
        known = {d["device_id"] for d in service.client.devices(group=group)["devices"]}
        if devices <= known:
            return
        if time.monotonic() > deadline:
            missing = ", ".join(sorted(devices - known))
            raise FleetServiceError(f"the fleet service has not seen {missing} within {timeout_s:.0f} s")
        time.sleep(0.2)


def follow_deployment(
    service: DemoService,
    deployment_id: str,
    on_change: Callable[[str, dict[str, Any]], None],
    timeout_s: float,
) -> dict[str, Any]:
    """Read the deployment until the service ends it; ``on_change`` gets ``wave_started``
    (a new wave), ``aborted`` and ``finished`` as they are seen. Returns the last detail."""
    deadline = time.monotonic() + timeout_s
    seen_wave: int | None = None
    while True:
        detail = service.client.deployment(deployment_id)
        if detail["state"] != "PENDING" and detail["wave"] != seen_wave:
            seen_wave = detail["wave"]
            on_change("wave_started", {"wave": seen_wave})
        if detail["state"] in FINISHED_ROLLOUT_STATES:
            if detail["state"] != "SUCCEEDED":
                on_change("aborted", {"wave": detail["wave"], "reason": detail["reason"]})
            on_change("finished", {"state": detail["state"]})
            return detail
        if time.monotonic() > deadline:
            raise FleetServiceError(
                f"deployment {deployment_id} still {detail['state']} after {timeout_s:.0f} s; see {service.log_file}"
            )
        time.sleep(_POLL_S)
