"""``edgesdk fleet enroll list|approve|revoke``: which device keys receive bundles."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from edgesdk.cli.fleet_cmd import server_options
from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import EnrollmentError, UsageError
from edgesdk.fleet.broker_credentials import (
    DevicePasswordFile,
    check_device_username,
    issue_device_credentials,
    publish_credentials,
)
from edgesdk.fleet.enrollment import (
    REGISTRY_ENV,
    Candidate,
    RegistryFile,
    decode_public_key,
    discover_candidates,
    enrollment_table,
    registry_path,
    shared_key_devices,
)

registry_option = click.option(
    "--registry",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Enrollment registry (JSON). Default: ${REGISTRY_ENV}, else ./edgesdk-enrollment.json.",
)
device_passwords_option = click.option(
    "--device-passwords",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The broker's device password file (mosquitto format): approve issues the device its own broker "
    "password there, revoke removes it. Reload the broker afterwards (SIGHUP).",
)
wait_option = click.option(
    "--wait", default=2.0, show_default=True, type=click.FloatRange(0.1, 60), help="Seconds to collect requests."
)


def optional_broker_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The connection flags of every ``edgesdk fleet`` command, with --broker optional here."""
    options = [
        click.option(
            "--broker", envvar="EDGESDK_BROKER", help="Read announced keys from this broker (mqtt[s]://HOST:PORT)."
        ),
        click.option("--namespace", default="edgesdk", show_default=True, help="Topic prefix of the fleet."),
        click.option("--username", envvar="EDGESDK_BROKER_USER", help="Broker user name."),
        click.option(
            "--password-file", type=click.Path(dir_okay=False, path_type=Path), help="File holding the broker password."
        ),
        click.option("--ca-file", type=click.Path(dir_okay=False, path_type=Path), help="CA that signed the broker."),
        click.option("--cert-file", type=click.Path(dir_okay=False, path_type=Path), help="Client certificate (mTLS)."),
        click.option("--key-file", type=click.Path(dir_okay=False, path_type=Path), help="Client key (mTLS)."),
        click.option(
            "--connect-timeout",
            default=5.0,
            show_default=True,
            type=click.FloatRange(min=0.1),
            help="Seconds to connect.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _candidates(params: dict[str, Any], wait: float) -> dict[str, Candidate]:
    from edgesdk.cli.fleet_cmd import client_options_from

    options = client_options_from(params, f"edgesdk-enroll-{secrets.token_hex(4)}")
    return discover_candidates(
        options, namespace=params["namespace"], wait_s=wait, connect_timeout_s=params["connect_timeout"]
    )


@click.group()
def enroll() -> None:
    """Approve the devices whose keys bundles are encrypted to; revoke them."""


def _server(broker: dict[str, Any]) -> Any:
    from edgesdk.cli.fleet_cmd import service_client

    return service_client(broker)


def _print_service_row(row: dict[str, Any], as_json: bool) -> None:
    for warning in row.get("warnings") or []:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        print_json(row)
    else:
        click.echo(f"{row['device_id']}: {row['status']} (key id {row['key_id']}) on the fleet service")


_KEY_ID = re.compile(r"^[0-9a-fA-F]{32}$")


def _full_key_id(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """--key-id must be the whole id: a key whose id starts with a short prefix can be ground."""
    if value is not None and not _KEY_ID.match(value):
        raise UsageError(
            f"bad --key-id {value!r}: give the full key id, 32 hex digits, as `edge-agent key` prints it "
            "(a prefix is not enough: a key matching a prefix can be made)"
        )
    return value.lower() if value is not None else None


def _local_only(**given: object) -> None:
    """With --server the service's registry decides: refuse flags that name local files."""
    named = [f"--{name.replace('_', '-')}" for name, value in given.items() if value not in (None, False)]
    if named:
        raise UsageError(
            f"{', '.join(named)} cannot be combined with --server: the fleet service keeps the one enrollment "
            "registry (drop --server to work on a local registry file)"
        )


def _status(row: dict[str, Any]) -> str:
    """A service row's status, flagged when the device announced another key since."""
    if not row.get("offered_key_id"):
        return str(row["status"])
    return f"{row['status']}, other key offered"


@enroll.command("list")
@registry_option
@optional_broker_options
@server_options
@wait_option
@json_option
def list_devices(registry: Path | None, wait: float, as_json: bool, **broker: Any) -> None:
    """Approved and revoked devices, and (with --broker) devices waiting for approval; with
    --server, the fleet service's enrollment requests (its registry, never a local file)."""
    client = _server(broker)
    if client is not None:
        _local_only(registry=registry)
        requests = client.enrollment()
        if as_json:
            print_json(requests)
            return
        print_table(
            f"{len(requests)} devices ({client.server})",
            ["device", "status", "key id", "offered key id", "profile", "hostname"],
            [
                (
                    r["device_id"],
                    _status(r),
                    r["key_id"],
                    r.get("offered_key_id") or "-",
                    r["profile"] or "-",
                    r["hostname"] or "-",
                )
                for r in requests
            ],
        )
        return
    path = registry_path(registry)
    candidates = _candidates(broker, wait) if broker["broker"] else {}
    rows = enrollment_table(RegistryFile(path).load(), candidates)
    if as_json:
        print_json(rows)
        return
    print_table(
        f"{len(rows)} devices ({path})",
        ["device", "status", "key id", "offered key id", "profile", "seen via"],
        [
            (
                r["device_id"],
                r["status"],
                r["key_id"],
                r["offered_key_id"] or "-",
                r["profile"] or "-",
                r["seen_via"] or "-",
            )
            for r in rows
        ],
    )


@enroll.command("approve")
@click.argument("device_id")
@registry_option
@optional_broker_options
@server_options
@wait_option
@click.option(
    "--public-key", help="The device's public key (base64 or a PEM file) instead of reading it from --broker."
)
@click.option(
    "--key-id",
    "expect_key_id",
    callback=_full_key_id,
    help="The full key id (32 hex digits) the device shows locally (edge-agent key); approval fails if it "
    "differs. Required when the key comes from --broker or --server.",
)
@click.option("--replace", is_flag=True, help="Accept a new key for an approved device (re-flashed on purpose).")
@click.option(
    "--allow-shared-key",
    is_flag=True,
    help="Approve a key that is already approved for another device (refused otherwise; a copied image?).",
)
@device_passwords_option
@click.option(
    "--credentials-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the sealed credentials message here (to sideload it instead of, or besides, the broker).",
)
@json_option
def approve(
    device_id: str,
    registry: Path | None,
    wait: float,
    public_key: str | None,
    expect_key_id: str | None,
    replace: bool,
    allow_shared_key: bool,
    device_passwords: Path | None,
    credentials_out: Path | None,
    as_json: bool,
    **broker: Any,
) -> None:
    """Approve DEVICE_ID: bundles packaged from now on are encrypted to its key too."""
    client = _server(broker)
    if client is not None:
        _local_only(
            registry=registry, public_key=public_key, device_passwords=device_passwords, credentials_out=credentials_out
        )
        if expect_key_id is None:
            raise UsageError(_NEEDS_KEY_ID.format(device_id=device_id, source=client.server))
        decided = client.decide(
            device_id, "approve", key_id=expect_key_id, replace=replace, allow_shared_key=allow_shared_key
        )
        _print_service_row(decided, as_json)
        return
    profile = None
    if public_key is not None:
        key = decode_public_key(public_key)
    elif broker["broker"]:
        candidates = _candidates(broker, wait)
        if device_id not in candidates:
            waiting = ", ".join(sorted(candidates)) or "none"
            raise EnrollmentError(
                f"device {device_id!r} has not announced a key on {broker['broker']}; seen: {waiting}"
            )
        if expect_key_id is None:
            raise UsageError(_NEEDS_KEY_ID.format(device_id=device_id, source=broker["broker"]))
        key = decode_public_key(candidates[device_id].public_key)
        profile = candidates[device_id].profile
    else:
        raise EnrollmentError("approve needs the device's key: give --broker URL or --public-key KEY")
    if device_passwords is not None:
        check_device_username(device_id)  # before anything is written
        if not broker["broker"] and credentials_out is None:
            raise EnrollmentError("--device-passwords needs --broker or --credentials-out to deliver the password")
    registry_file = RegistryFile(registry_path(registry))
    entry = registry_file.approve(
        device_id,
        key,
        profile=profile,
        expect_key_id=expect_key_id,
        replace=replace,
        allow_shared_key=allow_shared_key,
    )
    shared = shared_key_devices(registry_file.load(), device_id, entry.key_id)
    if shared:
        click.echo(f"warning: key {entry.key_id} is also approved for {', '.join(shared)}", err=True)
    delivered = None
    if device_passwords is not None:
        delivered = _issue_credentials(device_id, key, device_passwords, credentials_out, broker)
    if as_json:
        print_json({**entry.model_dump(mode="json"), "broker_credentials": delivered, "shared_key_with": shared})
        return
    click.echo(
        f"approved {device_id} (key id {entry.key_id}) in {registry_file.path}; bundles packaged from it "
        "from now on include it"
    )
    if delivered is not None:
        click.echo(
            f"issued {device_id} its broker password ({device_passwords}; sealed to key {entry.key_id}, "
            f"delivered to {delivered}); reload the broker (kill -HUP) so it takes effect"
        )


_NEEDS_KEY_ID = (
    "approving {device_id!r} with the key announced on {source} needs --key-id: the full key id the device "
    "shows locally (edge-agent key), so that a key announced by someone else is never approved"
)


def _issue_credentials(
    device_id: str, key: X25519PublicKey, password_file: Path, out: Path | None, broker: dict[str, Any]
) -> str:
    """Issue, record and deliver the device's broker password; says where it went."""
    from edgesdk.cli.fleet_cmd import client_options_from

    credentials = issue_device_credentials(device_id, key, DevicePasswordFile(password_file))
    places = []
    if out is not None:
        out.write_text(credentials.model_dump_json(indent=2) + "\n")
        places.append(str(out))
    if broker["broker"]:
        options = client_options_from(broker, f"edgesdk-enroll-{secrets.token_hex(4)}")
        publish_credentials(options, broker["namespace"], credentials, timeout_s=broker["connect_timeout"])
        places.append(f"{broker['broker']} (retained)")
    return ", ".join(places)


@enroll.command("revoke")
@click.argument("device_id")
@registry_option
@click.option("--reason", default="", help="Why (kept in the registry for the audit trail).")
@device_passwords_option
@server_options
@json_option
def revoke(
    device_id: str,
    registry: Path | None,
    reason: str,
    device_passwords: Path | None,
    as_json: bool,
    server: str | None,
    token_file: Path | None,
) -> None:
    """Revoke DEVICE_ID: bundles packaged from now on have no key slot for it."""
    client = _server({"server": server, "token_file": token_file})
    if client is not None:
        _local_only(registry=registry, device_passwords=device_passwords)
        _print_service_row(client.decide(device_id, "revoke", reason=reason), as_json)
        return
    entry = RegistryFile(registry_path(registry)).revoke(device_id, reason=reason)
    removed = DevicePasswordFile(device_passwords).remove(device_id) if device_passwords is not None else False
    if as_json:
        print_json({**entry.model_dump(mode="json"), "broker_password_removed": removed})
        return
    if removed:
        click.echo(f"removed {device_id}'s broker password from {device_passwords}; reload the broker (kill -HUP)")
    click.echo(
        f"revoked {device_id} (key id {entry.key_id}); it cannot decrypt bundles packaged from now on. "
        "Bundles it already holds stay readable to it: package and push a new release to the others."
    )
