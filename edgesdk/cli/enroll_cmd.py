"""``edgesdk fleet enroll list|approve|revoke``: which device keys receive bundles."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import EnrollmentError
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


@enroll.command("list")
@registry_option
@optional_broker_options
@wait_option
@json_option
def list_devices(registry: Path | None, wait: float, as_json: bool, **broker: Any) -> None:
    """Approved and revoked devices, and (with --broker) devices waiting for approval."""
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
@wait_option
@click.option(
    "--public-key", help="The device's public key (base64 or a PEM file) instead of reading it from --broker."
)
@click.option("--key-id", "expect_key_id", help="Key id the device shows locally; approval fails if it differs.")
@click.option("--replace", is_flag=True, help="Accept a new key for an approved device (re-flashed on purpose).")
@json_option
def approve(
    device_id: str,
    registry: Path | None,
    wait: float,
    public_key: str | None,
    expect_key_id: str | None,
    replace: bool,
    as_json: bool,
    **broker: Any,
) -> None:
    """Approve DEVICE_ID: bundles packaged from now on are encrypted to its key too."""
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
    entry = RegistryFile(registry_path(registry)).approve(
        device_id, key, profile=profile, expect_key_id=expect_key_id, replace=replace
    )
    if as_json:
        print_json(entry.model_dump(mode="json"))
        return
    click.echo(f"approved {device_id} (key id {entry.key_id}); bundles packaged from now on include it")


@enroll.command("revoke")
@click.argument("device_id")
@registry_option
@click.option("--reason", default="", help="Why (kept in the registry for the audit trail).")
@json_option
def revoke(device_id: str, registry: Path | None, reason: str, as_json: bool) -> None:
    """Revoke DEVICE_ID: bundles packaged from now on have no key slot for it."""
    entry = RegistryFile(registry_path(registry)).revoke(device_id, reason=reason)
    if as_json:
        print_json(entry.model_dump(mode="json"))
        return
    click.echo(
        f"revoked {device_id} (key id {entry.key_id}); it cannot decrypt bundles packaged from now on. "
        "Bundles it already holds stay readable to it: package and push a new release to the others."
    )
