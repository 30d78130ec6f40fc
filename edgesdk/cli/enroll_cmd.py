"""``edgesdk fleet enroll list|approve|revoke``: which device keys receive bundles."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from edgesdk.cli.fleet_cmd import server_options
from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import EnrollmentError
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
    if as_json:
        print_json(row)
    else:
        click.echo(f"{row['device_id']}: {row['status']} (key id {row['key_id']})")


@enroll.command("list")
@registry_option
@optional_broker_options
@server_options
@wait_option
@json_option
def list_devices(registry: Path | None, wait: float, as_json: bool, **broker: Any) -> None:
    """Approved and revoked devices, and (with --broker) devices waiting for approval; with
    --server, the fleet service's enrollment requests."""
    client = _server(broker)
    if client is not None:
        requests = client.enrollment()
        if as_json:
            print_json(requests)
            return
        print_table(
            f"{len(requests)} devices ({client.server})",
            ["device", "status", "key id", "profile", "hostname"],
            [(r["device_id"], r["status"], r["key_id"], r["profile"] or "-", r["hostname"] or "-") for r in requests],
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
@click.option("--key-id", "expect_key_id", help="Key id the device shows locally; approval fails if it differs.")
@click.option("--replace", is_flag=True, help="Accept a new key for an approved device (re-flashed on purpose).")
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
    device_passwords: Path | None,
    credentials_out: Path | None,
    as_json: bool,
    **broker: Any,
) -> None:
    """Approve DEVICE_ID: bundles packaged from now on are encrypted to its key too."""
    client = _server(broker)
    if client is not None:
        _print_service_row(client.decide(device_id, "approve", replace=replace), as_json)
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
        key = decode_public_key(candidates[device_id].public_key)
        profile = candidates[device_id].profile
    else:
        raise EnrollmentError("approve needs the device's key: give --broker URL or --public-key KEY")
    if device_passwords is not None:
        check_device_username(device_id)  # before anything is written
        if not broker["broker"] and credentials_out is None:
            raise EnrollmentError("--device-passwords needs --broker or --credentials-out to deliver the password")
    entry = RegistryFile(registry_path(registry)).approve(
        device_id, key, profile=profile, expect_key_id=expect_key_id, replace=replace
    )
    delivered = None
    if device_passwords is not None:
        delivered = _issue_credentials(device_id, key, device_passwords, credentials_out, broker)
    if as_json:
        print_json({**entry.model_dump(mode="json"), "broker_credentials": delivered})
        return
    click.echo(f"approved {device_id} (key id {entry.key_id}); bundles packaged from now on include it")
    if delivered is not None:
        click.echo(
            f"issued {device_id} its broker password ({device_passwords}; sealed to key {entry.key_id}, "
            f"delivered to {delivered}); reload the broker (kill -HUP) so it takes effect"
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
