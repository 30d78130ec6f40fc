"""``edgesdk fleet serve``: run the fleet service; ``fleet serve token``: its operator tokens;
``fleet submit``: hand it a rollout through its database.

``serve`` runs until SIGTERM/SIGINT (a clean stop: running deployments stay IN_PROGRESS and
resume at the next start) and logs each rollout event as one line; with ``--api HOST:PORT`` it
also serves the REST API. ``submit`` writes a PENDING
deployment into the service's database, which the running service picks up; it needs no
broker connection and returns at once (``fleet status --server`` follows it later).

Everything these commands create (the SQLite database and its journal, uploaded bundles, the
enrollment registry, the data directory) is private to the service's user — files 0600,
directories 0700 — whatever the umask they were started with (``_private_files``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from edgesdk.cli.fleet_cmd import broker_options
from edgesdk.cli.fleet_rollout_cmd import OPERATOR_KEY_ENV, _operator_key
from edgesdk.cli.output import console, json_option, print_json
from edgesdk.cli.rollout_options import RolloutArgs, rollout_options
from edgesdk.errors import FleetServiceError, UsageError

DB_ENV = "EDGESDK_FLEET_SERVICE_DB"

_db_option = click.option(
    "--db",
    "db_url",
    envvar=DB_ENV,
    default=None,
    help=f"Database URL: sqlite:///PATH (default DATA_DIR/fleet-service.sqlite3) or "
    f"postgresql+psycopg://USER@HOST/DB (also ${DB_ENV}).",
)
_data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the service writes everything of its own: the default SQLite database, uploaded bundles, the "
    "enrollment registry (docs/fleet-service.md lists them). Default: the directory of a SQLite --db, "
    "else ~/.local/share/edgesdk/fleet-service.",
)


def share_group_options(fn: Any) -> Any:
    """``--share-group NAME`` and ``--no-shared-subscriptions`` (brokers without them)."""
    fn = click.option(
        "--no-shared-subscriptions",
        is_flag=True,
        help="Plain subscriptions, for brokers without MQTT 5 shared subscriptions (one ingest process only).",
    )(fn)
    return click.option(
        "--share-group",
        default="edgesdk-fleet",
        show_default=True,
        help="MQTT shared-subscription group ($share/GROUP/...) the ingest processes join.",
    )(fn)


def _data_dir(data_dir: Path | None, db_url: str | None) -> Path:
    """``--data-dir``, else the directory of a SQLite ``--db`` (an operator who put the database
    somewhere expects the service's other files there, not in the home directory), else
    ``~/.local/share/edgesdk/fleet-service``."""
    if data_dir is not None:
        return data_dir
    if db_url and db_url.startswith("sqlite:///"):
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            database = make_url(db_url).database
        except ArgumentError:
            database = None  # open_engine refuses the URL later, in one line
        if database and database != ":memory:":
            return Path(database).expanduser().resolve().parent
    return Path.home() / ".local" / "share" / "edgesdk" / "fleet-service"


def _db_url(db_url: str | None, data_dir: Path | None) -> str:
    from edgesdk.fleet.service.database import default_db_url

    return db_url or default_db_url(_data_dir(data_dir, None))


def _private_files(ctx: click.Context, data_dir: Path | None) -> None:
    """Files 0600 and directories 0700 while the command runs (the umask of this process, not
    the caller's 022), and the data directory itself made private when this creates it. The
    caller's umask comes back when the command ends: a program running this CLI in its own
    process (a test, an embedding tool) keeps the modes it asked for."""
    previous = os.umask(0o077)
    ctx.call_on_close(lambda: os.umask(previous))
    if data_dir is not None and not data_dir.exists():
        data_dir.mkdir(parents=True, mode=0o700)


@click.group("serve", invoke_without_command=True)
@broker_options(required=False)
@_db_option
@_data_dir_option
@click.option(
    "--operator-key",
    "key_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"Operator's Ed25519 private key that signs commands (or ${OPERATOR_KEY_ENV}).",
)
@click.option("--raw-retention", default="7d", show_default=True, help="Keep raw telemetry this long.")
@click.option("--minutely-retention", default="180d", show_default=True, help="Keep per-minute aggregates this long.")
@click.option("--maintenance-interval", default="60s", show_default=True, help="Downsample and prune this often.")
@click.option("--api", "api_bind", default=None, help="Serve the REST API on HOST:PORT (e.g. 127.0.0.1:8080).")
@click.option(
    "--broker-wait",
    default="60s",
    show_default=True,
    help="At start, keep trying to reach the broker this long (0: for ever), then exit 1.",
)
@click.option(
    "--metrics-listen",
    "metrics_bind",
    default=None,
    help="Serve /metrics without a token on HOST:PORT of its own (e.g. 127.0.0.1:9108), for a scraper that "
    "alone reaches it; without it, /metrics is on the --api listener and needs a viewer token.",
)
@click.option(
    "--public-url",
    default=None,
    help="Where operators reach the dashboard, e.g. https://fleet.example (a TLS proxy in front of --api): "
    "https:// makes its cookies Secure.",
)
@click.option(
    "--max-pending-enrollments",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Enrollment requests waiting for a decision at most; requests for more new ids are refused and counted.",
)
@click.option(
    "--artifact-url",
    "artifact_url",
    default=None,
    help="Base URL devices download bundles from (the API's /artifacts behind a proxy or CDN); "
    "default http://API-HOST:PORT/artifacts. Rollouts list it after their own --artifact-url.",
)
@click.option(
    "--registry",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Enrollment registry that API approvals are written to (default DATA_DIR/enrollment.json).",
)
@click.option(
    "--device-passwords",
    "device_passwords",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The broker's device password file (fleet enroll approve --device-passwords): "
    "DELETE /api/v1/devices/ID removes the device's line.",
)
@click.option(
    "--workers",
    type=int,
    default=0,
    show_default=True,
    help="Ingest worker processes sharing the device subscriptions (0: ingest in this process; >0 needs PostgreSQL).",
)
@share_group_options
@click.option(
    "--instance",
    default=None,
    help="Name of this process when several serve one fleet (each needs its own; one leader drives rollouts).",
)
@click.pass_context
def serve(
    ctx: click.Context,
    db_url: str | None,
    data_dir: Path | None,
    key_path: Path | None,
    raw_retention: str,
    minutely_retention: str,
    maintenance_interval: str,
    api_bind: str | None,
    broker_wait: str,
    metrics_bind: str | None,
    public_url: str | None,
    max_pending_enrollments: int,
    artifact_url: str | None,
    registry: Path | None,
    device_passwords: Path | None,
    workers: int,
    share_group: str,
    no_shared_subscriptions: bool,
    instance: str | None,
    **params: Any,
) -> None:
    """Run the fleet service: ingest device messages into a database and drive rollouts."""
    _private_files(ctx, data_dir)
    if ctx.invoked_subcommand is not None:
        return
    if not params.get("broker"):
        raise UsageError("edgesdk fleet serve needs --broker mqtt://HOST:PORT (or EDGESDK_BROKER)")
    from edgesdk.fleet.service.retention import Retention
    from edgesdk.fleet.service.service import FleetService, ServiceSettings, check_scaling
    from edgesdk.fleet.service.workers import check_name

    data_dir = _data_dir(data_dir, db_url)
    retention = Retention(
        raw_retention_s=_duration(raw_retention, "--raw-retention"),
        minutely_retention_s=_duration(minutely_retention, "--minutely-retention"),
    )
    settings = ServiceSettings(
        db_url=_db_url(db_url, data_dir),
        namespace=params["namespace"],
        retention=retention,
        maintenance_interval_s=_duration(maintenance_interval, "--maintenance-interval"),
        connect_timeout_s=float(params.get("connect_timeout") or 10.0),
        broker_wait_s=_wait(broker_wait, "--broker-wait"),
        data_dir=data_dir,
        api_bind=api_bind,
        artifact_url=artifact_url,
        registry_path=registry or data_dir / "enrollment.json",
        device_passwords=device_passwords,
        workers=workers,
        share_group=None if no_shared_subscriptions else check_name(share_group, "--share-group"),
        instance=check_name(instance, "--instance") if instance is not None else None,
        metrics_bind=metrics_bind,
        public_url=_public_url(public_url),
        max_pending_enrollments=max_pending_enrollments,
    )
    check_scaling(settings, settings.db_url)
    _check_binds(api_bind, metrics_bind)
    options = _persistent_client_options(params, settings.instance)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # one line per migration step otherwise
    service = FleetService(settings, options, _operator_key(key_path)).start()
    _serve_until_stopped(service, params["broker"], settings.namespace, data_dir)


def _check_binds(api_bind: str | None, metrics_bind: str | None) -> None:
    """--api and --metrics-listen parsed, so a bad value fails before the broker is touched."""
    if api_bind is not None:
        from edgesdk.fleet.service.rest.server import parse_bind

        parse_bind(api_bind)
    if metrics_bind is not None:
        from edgesdk.fleet.service.rest.server import parse_bind

        parse_bind(metrics_bind, "--metrics-listen")


def _persistent_client_options(params: dict[str, Any], instance: str | None) -> Any:
    """The service's MQTT client options from the connection flags, on a persistent session:
    statuses devices publish while the service restarts wait for it."""
    from dataclasses import replace

    from edgesdk.cli.fleet_cmd import client_options_from
    from edgesdk.fleet.service.service import service_client_id

    options = client_options_from(params, service_client_id(params["namespace"], instance))
    return replace(options, clean_start=False, session_expiry_s=7 * 24 * 3600)


def _serve_until_stopped(service: Any, broker: str, namespace: str, data_dir: Path) -> None:
    """Says where the service listens, then serves until SIGTERM or SIGINT; FleetServiceError
    (exit 1) when it stopped because it lost the leader lock."""
    signal.signal(signal.SIGTERM, lambda *_: service.stop())
    signal.signal(signal.SIGINT, lambda *_: service.stop())
    where = f", API on http://{service.api.host}:{service.api.port}" if service.api is not None else ""
    if service.metrics_server is not None:
        where = f", metrics on http://{service.metrics_server.host}:{service.metrics_server.port}/metrics{where}"
    # One unwrapped line (scripts and tests read the address from it, at the end of the line).
    click.echo(f"fleet service on {broker} (namespace {namespace}, data in {data_dir}){where}", nl=True)
    sys.stdout.flush()
    service.serve_forever()
    if service.lost_leadership:
        raise FleetServiceError("fleet service stopped: it lost the leader lock (its database connection); restart it")


@serve.group("token")
def token() -> None:
    """Operator tokens of the service's REST API (shown once when created)."""


@token.command("create")
@_db_option
@_data_dir_option
@click.option("--role", type=click.Choice(["viewer", "operator", "admin"]), required=True, help="What it may do.")
@click.option("--name", required=True, help="Who holds it (written to the audit log).")
@json_option
def token_create(db_url: str | None, data_dir: Path | None, role: str, name: str, as_json: bool) -> None:
    """Make a token; prints it once (the database keeps only its hash)."""
    import getpass

    from edgesdk.fleet.service.tokens import create_token

    engine = _migrated(db_url, data_dir)
    token_id, secret = create_token(engine, name=name, role=role, created_by=f"cli:{getpass.getuser()}")
    engine.dispose()
    if as_json:
        print_json({"id": token_id, "name": name, "role": role, "token": secret})
    else:
        click.echo(secret)


@token.command("list")
@_db_option
@_data_dir_option
@json_option
def token_list(db_url: str | None, data_dir: Path | None, as_json: bool) -> None:
    """Every token (id, holder, role, created, revoked); never the tokens themselves."""
    from edgesdk.cli.output import print_table
    from edgesdk.fleet.service.tokens import list_tokens

    engine = _migrated(db_url, data_dir)
    rows = list_tokens(engine)
    engine.dispose()
    if as_json:
        print_json(rows)
    else:
        print_table(
            "tokens",
            ["id", "name", "role", "revoked"],
            [(r["id"], r["name"], r["role"], bool(r["revoked"])) for r in rows],
        )


@token.command("revoke")
@click.argument("token_id")
@_db_option
@_data_dir_option
def token_revoke(token_id: str, db_url: str | None, data_dir: Path | None) -> None:
    """Refuse token TOKEN_ID from now on."""
    from edgesdk.fleet.service.tokens import revoke_token

    engine = _migrated(db_url, data_dir)
    revoke_token(engine, token_id)
    engine.dispose()
    console().print(f"token {token_id} revoked")


def _migrated(db_url: str | None, data_dir: Path | None) -> Any:
    from edgesdk.fleet.service.database import migrate, open_engine

    engine = open_engine(_db_url(db_url, data_dir))
    migrate(engine)
    return engine


def _public_url(text: str | None) -> str | None:
    if text is None:
        return None
    if not text.startswith(("https://", "http://")) or "://" == text[-3:]:
        raise UsageError(
            f"bad --public-url {text!r}: expected https://HOST[:PORT] (where operators open the dashboard)"
        )
    return text.rstrip("/")


def _duration(text: str, option: str) -> float:
    from edgesdk.fleet.rollout import parse_duration

    seconds = parse_duration(text, option=option)
    if seconds <= 0:
        raise UsageError(f"bad {option} {text!r}: must be positive, e.g. 60s, 7d")
    return seconds


def _wait(text: str, option: str) -> float:
    """A duration of 0 or more (0: no limit)."""
    from edgesdk.fleet.rollout import parse_duration

    return parse_duration(text, option=option)


@click.command("submit")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@_db_option
@_data_dir_option
@rollout_options
@json_option
def submit(bundle: Path, db_url: str | None, data_dir: Path | None, rollout: RolloutArgs, as_json: bool) -> None:
    """Hand BUNDLE to the running fleet service as a staged rollout (returns at once)."""
    _private_files(click.get_current_context(), data_dir)
    from edgesdk.fleet.service.store import SqlRolloutStore
    from edgesdk.fleet.service.submit import submit_deployment

    plan = rollout.plan()
    health = rollout.health(plan)
    urls = rollout.urls()
    if not bundle.is_file():
        raise UsageError(f"bundle file {str(bundle)!r} not found")
    engine = _migrated(db_url, data_dir)
    store = SqlRolloutStore(engine)
    message = submit_deployment(
        store,
        bundle,
        plan,
        devices=rollout.resolved_devices(engine),
        group=rollout.group,
        deployment_id=rollout.deployment_id,
        health=health,
        chunk_size=rollout.chunk_size,
        artifact_urls=urls,
        mqtt_fallback=rollout.mqtt_fallback,
    )
    summary = store.summary(message.deployment_id)
    engine.dispose()
    if as_json:
        print_json(summary)
    else:
        console().print(f"deployment {message.deployment_id} submitted ({summary['devices']} devices, PENDING)")
