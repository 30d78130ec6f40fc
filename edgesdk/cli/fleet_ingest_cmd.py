"""``edgesdk fleet ingest``: one ingest worker process on its own (another host, a container).

``edgesdk fleet serve --workers N`` starts N of these itself and restarts them; run this
command instead when the workers live elsewhere (one per Kubernetes StatefulSet pod, a systemd
unit per worker with ``Restart=always``). Each needs a stable ``--worker-id``: its persistent
session at the broker, and the messages it had not acknowledged when it died, wait under it.
"""

from __future__ import annotations

from typing import Any

import click

from edgesdk.cli.fleet_cmd import broker_options
from edgesdk.cli.fleet_serve_cmd import DB_ENV, share_group_options
from edgesdk.errors import UsageError


@click.command("ingest")
@broker_options
@click.option("--db", "db_url", envvar=DB_ENV, required=True, help=f"postgresql+psycopg://USER@HOST/DB (or ${DB_ENV}).")
@click.option("--worker-id", required=True, help="Stable id of this worker (its MQTT session lives under it).")
@share_group_options
@click.option(
    "--max-pending-enrollments",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Enrollment requests waiting for a decision at most (as fleet serve's; every worker enforces it).",
)
def ingest(
    db_url: str,
    worker_id: str,
    share_group: str,
    no_shared_subscriptions: bool,
    max_pending_enrollments: int,
    **params: Any,
) -> None:
    """Run one ingest worker: shared device subscriptions into the fleet database."""
    from edgesdk.cli.fleet_cmd import client_options_from
    from edgesdk.fleet.service.workers import WorkerSettings, check_name, run_worker, worker_client_id

    if no_shared_subscriptions:
        raise UsageError("fleet ingest workers share subscriptions; without them run one 'fleet serve --workers 0'")
    if not db_url.startswith("postgresql"):
        raise UsageError(
            f"bad --db {db_url.split('://')[0]}://…: ingest workers need PostgreSQL (SQLite is one process)"
        )
    if params["connect_timeout"] <= 0:
        raise UsageError(f"--connect-timeout must be positive (got {params['connect_timeout']})")
    settings = WorkerSettings(
        db_url=db_url,
        worker_id=check_name(worker_id, "--worker-id"),
        namespace=params["namespace"],
        share_group=check_name(share_group, "--share-group"),
        connect_timeout_s=float(params["connect_timeout"]),
        max_pending_enrollments=max_pending_enrollments,
    )
    run_worker(settings, client_options_from(params, worker_client_id(settings.namespace, settings.worker_id)))
