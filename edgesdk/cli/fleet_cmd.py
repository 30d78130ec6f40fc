"""``edgesdk fleet``: see and steer a fleet of devices over MQTT.

Subcommands are registered in ``FLEET_COMMANDS`` (name → ``"module:attr"``) and imported
lazily, so rollout (push/status/abort/rollback) and enrollment commands each add one line.
``broker_options`` and ``client_options_from`` give every subcommand the same connection flags.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgesdk.cli.main import LazyGroup
from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import UsageError

FLEET_COMMANDS: dict[str, str] = {
    "devices": "edgesdk.cli.fleet_cmd:devices",
    "watch": "edgesdk.cli.fleet_cmd:watch",
    "push": "edgesdk.cli.fleet_rollout_cmd:push",
    "status": "edgesdk.cli.fleet_rollout_cmd:status",
    "abort": "edgesdk.cli.fleet_rollout_cmd:abort",
    "rollback": "edgesdk.cli.fleet_rollout_cmd:rollback",
    "enroll": "edgesdk.cli.enroll_cmd:enroll",
    "serve": "edgesdk.cli.fleet_serve_cmd:serve",
    "submit": "edgesdk.cli.fleet_serve_cmd:submit",
    "ingest": "edgesdk.cli.fleet_ingest_cmd:ingest",
    "reprovision": "edgesdk.cli.reprovision_cmd:reprovision",
    "tag": "edgesdk.cli.fleet_targeting_cmd:tag",
    "filter": "edgesdk.cli.fleet_targeting_cmd:target_filter",
    "webhook": "edgesdk.cli.fleet_targeting_cmd:webhook",
    "window": "edgesdk.cli.fleet_targeting_cmd:window",
}

COLUMNS = (
    "device",
    "online",
    "profile",
    "model",
    "version",
    "variant",
    "temp °C",
    "p95 ms",
    "errors",
    "outbox",
    "seen",
)


@click.group(cls=LazyGroup, lazy=FLEET_COMMANDS)
def fleet() -> None:
    """See and update a fleet of devices over MQTT."""


def broker_options(fn: Callable[..., Any] | None = None, *, required: bool = True) -> Any:
    """Add the connection flags (broker URL, namespace, credentials, TLS) to a command;
    ``required=False`` for commands that can work without a broker (``--server``)."""
    if fn is None:
        return functools.partial(broker_options, required=required)
    options = [
        click.option(
            "--broker",
            envvar="EDGESDK_BROKER",
            required=required,
            help="mqtt://HOST:PORT or mqtts://HOST:PORT (also EDGESDK_BROKER).",
        ),
        click.option("--namespace", default="edgesdk", show_default=True, help="Topic prefix of the fleet."),
        click.option("--username", envvar="EDGESDK_BROKER_USER", help="Broker user name."),
        click.option(
            "--password-file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="File holding the broker password (never pass it on the command line).",
        ),
        click.option("--ca-file", type=click.Path(dir_okay=False, path_type=Path), help="CA that signed the broker."),
        click.option("--cert-file", type=click.Path(dir_okay=False, path_type=Path), help="Client certificate (mTLS)."),
        click.option("--key-file", type=click.Path(dir_okay=False, path_type=Path), help="Client key (mTLS)."),
        click.option("--connect-timeout", default=5.0, show_default=True, type=float, help="Seconds to connect."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def server_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--server URL`` and ``--token-file FILE``: run the command through the fleet service's
    REST API (``edgesdk fleet serve --api``) instead of standalone."""
    fn = click.option(
        "--token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="File holding the operator token for --server (or $EDGESDK_FLEET_TOKEN).",
    )(fn)
    return click.option(
        "--server",
        default=None,
        help="Use the fleet service at this URL (http(s)://HOST:PORT; or $EDGESDK_FLEET_SERVER).",
    )(fn)


def service_client(params: dict[str, Any]) -> Any:
    """The fleet service client ``--server``/``$EDGESDK_FLEET_SERVER`` names, else None; pops
    the two flags from ``params``."""
    from edgesdk.fleet.service_client import client_from

    return client_from(params.pop("server", None), params.pop("token_file", None))


def require_broker(params: dict[str, Any]) -> None:
    """One clear line when a standalone command has neither a broker nor a server."""
    if not params.get("broker"):
        raise UsageError("give --broker mqtt://HOST:PORT (or EDGESDK_BROKER), or --server URL of a fleet service")


def client_options_from(params: dict[str, Any], client_id: str) -> Any:
    """Build ``ClientOptions`` from the ``broker_options`` flags; bad values raise UsageError."""
    from edgesdk.mqtt.client import ClientOptions, TlsSettings, parse_broker_url

    address = parse_broker_url(params["broker"])
    password = None
    if params.get("password_file"):
        path: Path = params["password_file"]
        try:
            password = path.read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --password-file {str(path)!r}: {exc.strerror or exc}") from exc
    for flag in ("ca_file", "cert_file", "key_file"):
        value = params.get(flag)
        if value is not None and not Path(value).is_file():
            raise UsageError(f"--{flag.replace('_', '-')} {str(value)!r} does not exist")
    tls = None
    if address.tls or params.get("ca_file") or params.get("cert_file"):
        tls = TlsSettings(
            ca_file=str(params["ca_file"]) if params.get("ca_file") else None,
            cert_file=str(params["cert_file"]) if params.get("cert_file") else None,
            key_file=str(params["key_file"]) if params.get("key_file") else None,
        )
    return ClientOptions(
        client_id=client_id,
        broker_url=params["broker"],
        username=params.get("username"),
        password=password,
        tls=tls,
        clean_start=True,
        session_expiry_s=0,
        backoff_min_s=0.2,
        backoff_max_s=2.0,
    )


def _open_monitor(params: dict[str, Any]) -> Any:
    from edgesdk.fleet.monitor import FleetMonitor, monitor_client_id

    if params["connect_timeout"] <= 0:
        raise UsageError(f"--connect-timeout must be positive (got {params['connect_timeout']})")
    monitor = FleetMonitor(client_options_from(params, monitor_client_id()), namespace=params["namespace"])
    return monitor.start(timeout=params["connect_timeout"])


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _rows(views: list[Any], lost_since: float | None = None) -> list[list[str]]:
    """Table rows; ``lost_since``: the monitor lost the broker then, so presence is unknown."""
    now = time.time()
    unknown = None if lost_since is None else f"unknown since {time.strftime('%H:%M', time.localtime(lost_since))}"
    rows = []
    for v in views:
        seen = f"{max(0.0, now - v.last_seen.timestamp()):.0f}s ago" if v.last_seen else "-"
        rows.append(
            [
                v.device_id,
                unknown or _fmt(v.online),
                _fmt(v.profile),
                _fmt(v.model),
                _fmt(v.model_version),
                _fmt(v.variant),
                _fmt(v.temperature_c),
                _fmt(v.p95_ms, 2),
                _fmt(v.errors),
                _fmt(v.outbox_depth),
                seen,
            ]
        )
    return rows


def _with_broker(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(**params: Any) -> Any:
        return fn(params)

    return wrapper


@fleet.command()
@broker_options(required=False)
@server_options
@click.option("--wait", "wait_s", default=2.0, show_default=True, type=float, help="Seconds to collect messages.")
@click.option("--group", default=None, help="With --server: only devices of this group.")
@click.option("--model-version", default=None, help="With --server: only devices running this model version.")
@click.option("--state", default=None, help="With --server: online, offline or an OTA state (COMMITTED, FAILED, …).")
@json_option
@_with_broker
def devices(params: dict[str, Any]) -> None:
    """List every device the broker knows (retained presence and latest telemetry), or that
    the fleet service knows (``--server``)."""
    client = service_client(params)
    if client is not None:
        _service_devices(client, params)
        return
    require_broker(params)
    if params["wait_s"] < 0:
        raise UsageError(f"--wait must not be negative (got {params['wait_s']})")
    monitor = _open_monitor(params)
    try:
        monitor.settle(params["wait_s"])
        views = monitor.view.snapshot()
    finally:
        monitor.stop()
    if params["as_json"]:
        print_json({"devices": [v.as_dict() for v in views], "malformed_messages": monitor.view.stats.malformed})
        return
    if not views:
        click.echo(f"no devices seen under {params['namespace']}/devices/ on {params['broker']}")
        return
    online = sum(1 for v in views if v.online)
    print_table(f"{len(views)} device(s), {online} online", COLUMNS, _rows(views))


def _service_devices(client: Any, params: dict[str, Any]) -> None:
    listing = client.devices(group=params["group"], version=params["model_version"], state=params["state"])
    if params["as_json"]:
        print_json(listing)
        return
    now = time.time()
    broker = _service_broker(client)
    rows = [
        [
            d["device_id"],
            _presence(d["online"], broker),
            _fmt(d["profile"]),
            _fmt(d["model_name"]),
            _fmt(d["model_version"]),
            _fmt(d["variant"]),
            _fmt((d.get("latest") or {}).get("temperature_c")),
            _fmt((d.get("latest") or {}).get("p95_ms"), 2),
            _fmt((d.get("latest") or {}).get("errors")),
            _fmt((d.get("latest") or {}).get("outbox_depth")),
            f"{max(0.0, now - d['last_seen']):.0f}s ago",
        ]
        for d in listing["devices"]
    ]
    online = sum(1 for d in listing["devices"] if d["online"])
    lost = "" if broker is None or broker.presence_known() else f"; {_broker_note(broker)}"
    print_table(f"{listing['total']} device(s), {online} online ({client.server}{lost})", COLUMNS, rows)


def _service_broker(client: Any) -> Any:
    """The service's broker connection from its ``/healthz`` (200 or 503); None when it has no
    such route or does not answer (the listing then shows what the database says)."""
    import json
    import urllib.error
    import urllib.request

    from edgesdk.fleet.service.broker_watch import BrokerStatus

    try:
        with urllib.request.urlopen(f"{client.server}/healthz", timeout=client.timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read() if exc.code == 503 else b""
    except (urllib.error.URLError, OSError):
        return None
    try:
        return BrokerStatus.from_dict(json.loads(body).get("broker"))
    except (ValueError, AttributeError):
        return None


def _presence(online: bool | None, broker: Any) -> str:
    """yes / no, or "unknown since HH:MM" while the service cannot trust a stored offline."""
    from edgesdk.fleet.service.broker_watch import presence_label

    label = presence_label(online, broker)
    return label if label.startswith("unknown") else _fmt(online)


def _broker_note(broker: Any) -> str:
    since = broker.since.astimezone().strftime("%H:%M")
    if broker.connected:
        return f"the service's broker is back since {since}: re-learning presence"
    return f"the service has lost its broker since {since}: presence unknown"


@fleet.command()
@broker_options
@click.option("--interval", default=1.0, show_default=True, type=float, help="Seconds between refreshes.")
@click.option("--duration", default=0.0, type=float, help="Stop after this many seconds (0: until Ctrl-C).")
@_with_broker
def watch(params: dict[str, Any]) -> None:
    """A live table of the fleet, refreshed every --interval seconds (Ctrl-C to stop). Piped (a
    log, tee, grep), a new table stamped with the time each time the fleet changed."""
    from rich.live import Live
    from rich.table import Table

    from edgesdk.cli.output import console, fit_when_piped, make_table

    if params["interval"] <= 0:
        raise UsageError(f"--interval must be positive (got {params['interval']})")
    monitor = _open_monitor(params)
    out = console()

    def state() -> tuple[str, list[list[str]]]:
        views = monitor.view.snapshot()
        lost = monitor.lost_since
        online = sum(1 for v in views if v.online)
        title = f"{params['broker']} — {len(views)} device(s), {online} online"
        if lost is not None:
            title = f"{params['broker']} — lost since {time.strftime('%H:%M:%S', time.localtime(lost))}, reconnecting"
        return title, _rows(views, lost)

    def render(title: str, rows: list[list[str]]) -> Table:
        table = make_table(title, COLUMNS, rows, whole_cells=not out.is_terminal)
        fit_when_piped(out, table)
        return table

    deadline = time.monotonic() + params["duration"] if params["duration"] > 0 else None
    try:
        if out.is_terminal:
            with Live(render(*state()), console=out, auto_refresh=False, transient=False) as live:
                while deadline is None or time.monotonic() < deadline:
                    time.sleep(params["interval"])
                    live.update(render(*state()), refresh=True)
        else:
            # A redrawn table reaches a pipe only when the watch ends: print one whenever what it
            # shows changed (the "seen" ages alone do not count), as it happens.
            shown: tuple[str, list[list[str]]] | None = None
            while True:
                title, rows = state()
                changed = (title, [row[:-1] for row in rows])  # the last column is "seen"
                if changed != shown:
                    shown = changed
                    out.print(render(f"{time.strftime('%H:%M:%S')} {title}", rows))
                    out.file.flush()
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(params["interval"])
    except KeyboardInterrupt:  # Ctrl-C is how a watch ends: exit 0, not an error
        pass
    finally:
        monitor.stop()
