"""``edgesdk fleet tag|filter|webhook``: the fleet service's server-side device tags, dynamic
groups (saved target filters) and webhooks, through its REST API (``--server``; tags and
filters live in the service's database, so there is no standalone form)."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import click

from edgesdk.cli.fleet_cmd import server_options, service_client
from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import UsageError


def _client(params: dict[str, Any], what: str) -> Any:
    client = service_client(params)
    if client is None:
        raise UsageError(f"{what}: kept by the fleet service; give --server URL (or $EDGESDK_FLEET_SERVER)")
    return client


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise UsageError(f"bad tag {text!r}: expected KEY=VALUE (e.g. site=berlin)")
    return key, value


def _quoted(text: str) -> str:
    return urllib.parse.quote(text, safe="")


@click.command("tag")
@click.argument("device")
@click.argument("pairs", nargs=-1)
@click.option("--remove", "removed", multiple=True, metavar="KEY", help="Remove this tag (repeatable).")
@server_options
@json_option
def tag(device: str, pairs: tuple[str, ...], removed: tuple[str, ...], as_json: bool, **params: Any) -> None:
    """Set tags KEY=VALUE on DEVICE in the fleet service (no KEY=VALUE and no --remove: show them)."""
    parsed = [_pair(p) for p in pairs]  # every pair checked before anything is written
    client = _client(params, "device tags")
    answer = client.call("GET", f"/devices/{_quoted(device)}/tags")
    for key, value in parsed:
        answer = client.call("PUT", f"/devices/{_quoted(device)}/tags/{_quoted(key)}", {"value": value})
    for key in removed:
        answer = client.call("DELETE", f"/devices/{_quoted(device)}/tags/{_quoted(key)}")
    if as_json:
        print_json(answer)
    else:
        print_table(f"tags of {device}", ("key", "value"), sorted(answer["tags"].items()))


@click.group("filter")
def target_filter() -> None:
    """Dynamic groups: saved filters (``tag.site=berlin and profile=pi5``) a rollout can target
    with ``--target-filter NAME`` (resolved when the rollout is created)."""


@target_filter.command("save")
@click.argument("name")
@click.argument("where")
@server_options
@json_option
def save_filter(name: str, where: str, as_json: bool, **params: Any) -> None:
    """Save WHERE as the dynamic group NAME (replacing one of that name)."""
    saved = _client(params, "target filters").call("PUT", f"/target-filters/{_quoted(name)}", {"where": where})
    if as_json:
        print_json(saved)
    else:
        print_table(f"{name}: {where}", ("device (now)",), [[d] for d in saved["devices"]])


@target_filter.command("list")
@server_options
@json_option
def list_filters(as_json: bool, **params: Any) -> None:
    """Every saved filter and the devices it selects now."""
    filters, _ = _client(params, "target filters").pages("/target-filters")
    if as_json:
        print_json(filters)
    else:
        rows = [[f["name"], f["where"], len(f["devices"])] for f in filters]
        print_table("target filters", ("name", "where", "devices now"), rows)


@target_filter.command("delete")
@click.argument("name")
@server_options
def delete_filter(name: str, **params: Any) -> None:
    """Delete the saved filter NAME (rollouts made from it keep their devices)."""
    _client(params, "target filters").call("DELETE", f"/target-filters/{_quoted(name)}")
    click.echo(f"target filter {name} deleted")


@click.group("window")
def window() -> None:
    """Maintenance windows per group: a rollout to ``--group G`` without ``--window`` takes G's."""


@window.command("set")
@click.argument("group")
@click.argument("hours", metavar="HH:MM-HH:MM")
@click.option("--window-tz", default=None, help="The devices' zone (IANA); default the service's.")
@server_options
def set_window(group: str, hours: str, window_tz: str | None, **params: Any) -> None:
    """Give GROUP the maintenance window HOURS (in the devices' local time)."""
    from edgesdk.fleet import schedule

    schedule.parse_window(hours)  # one line here, before any request
    body = {"window": hours, "window_tz": window_tz}
    saved = _client(params, "group windows").call("PUT", f"/groups/{_quoted(group)}/window", body)
    click.echo(f"group {group}: window {saved['window']} ({saved['window_tz'] or 'the service default zone'})")


@window.command("list")
@server_options
@json_option
def list_windows(as_json: bool, **params: Any) -> None:
    """Every group's maintenance window."""
    windows, _ = _client(params, "group windows").pages("/group-windows")
    if as_json:
        print_json(windows)
    else:
        rows = [[w["group"], w["window"], w["window_tz"] or "service default"] for w in windows]
        print_table("maintenance windows", ("group", "window", "zone"), rows)


@window.command("clear")
@click.argument("group")
@server_options
def clear_window(group: str, **params: Any) -> None:
    """Remove GROUP's maintenance window (rollouts made already keep theirs)."""
    _client(params, "group windows").call("DELETE", f"/groups/{_quoted(group)}/window")
    click.echo(f"group {group}: no maintenance window")


@click.group("webhook")
def webhook() -> None:
    """Webhooks for rollout and alert events (signed with HMAC-SHA256; admin token)."""


@webhook.command("add")
@click.argument("url")
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="File holding the signing secret (at least 16 characters; never shown back).",
)
@click.option("--event", "events", multiple=True, help="Event prefix to send (rollout., alert.firing…); default all.")
@click.option("--alertmanager", is_flag=True, help="Send alert events as Alertmanager's webhook payload.")
@server_options
@json_option
def add_webhook(
    url: str, secret_file: Path, events: tuple[str, ...], alertmanager: bool, as_json: bool, **params: Any
) -> None:
    """Register URL for events."""
    try:
        secret = secret_file.read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read --secret-file {str(secret_file)!r}: {exc.strerror or exc}") from None
    if len(secret) < 16:
        raise UsageError(f"--secret-file {str(secret_file)!r} holds {len(secret)} characters; use at least 16")
    body = {
        "url": url,
        "secret": secret,
        "events": list(events),
        "format": "alertmanager" if alertmanager else "edgesdk",
    }
    made = _client(params, "webhooks").call("POST", "/webhooks", body)
    if as_json:
        print_json(made)
    else:
        click.echo(f"webhook {made['id']} → {made['url']}")


@webhook.command("list")
@server_options
@json_option
def list_webhooks(as_json: bool, **params: Any) -> None:
    """Every webhook (without its secret)."""
    hooks, _ = _client(params, "webhooks").pages("/webhooks")
    if as_json:
        print_json(hooks)
    else:
        rows = [[h["id"], h["url"], ",".join(h["events"]) or "all", h["format"]] for h in hooks]
        print_table("webhooks", ("id", "url", "events", "format"), rows)


@webhook.command("remove")
@click.argument("webhook_id")
@server_options
def remove_webhook(webhook_id: str, **params: Any) -> None:
    """Remove the webhook WEBHOOK_ID."""
    _client(params, "webhooks").call("DELETE", f"/webhooks/{_quoted(webhook_id)}")
    click.echo(f"webhook {webhook_id} removed")
