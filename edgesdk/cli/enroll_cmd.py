"""``edgesdk fleet enroll list|approve|revoke``: which device keys receive bundles."""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import EnrollmentError
from edgesdk.fleet.enrollment import (
    REGISTRY_ENV,
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
broker_option = click.option("--broker", help="Broker to read enroll requests from: mqtt[s]://HOST[:PORT].")
namespace_option = click.option("--namespace", default="edgesdk", show_default=True, help="MQTT topic namespace.")
ca_option = click.option("--ca", type=click.Path(dir_okay=False, exists=True), help="CA certificate for mqtts://.")
wait_option = click.option(
    "--wait", default=2.0, show_default=True, type=click.FloatRange(0.1, 60), help="Seconds to collect requests."
)


@click.group()
def enroll() -> None:
    """Approve the devices whose keys bundles are encrypted to; revoke them."""


@enroll.command("list")
@registry_option
@broker_option
@namespace_option
@ca_option
@wait_option
@json_option
def list_devices(
    registry: Path | None, broker: str | None, namespace: str, ca: str | None, wait: float, as_json: bool
) -> None:
    """Approved and revoked devices, and (with --broker) devices waiting for approval."""
    path = registry_path(registry)
    candidates = discover_candidates(broker, namespace=namespace, wait_s=wait, ca_file=ca) if broker else {}
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
@broker_option
@namespace_option
@ca_option
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
    broker: str | None,
    namespace: str,
    ca: str | None,
    wait: float,
    public_key: str | None,
    expect_key_id: str | None,
    replace: bool,
    as_json: bool,
) -> None:
    """Approve DEVICE_ID: bundles packaged from now on are encrypted to its key too."""
    profile = None
    if public_key is not None:
        key = decode_public_key(public_key)
    elif broker is not None:
        candidates = discover_candidates(broker, namespace=namespace, wait_s=wait, ca_file=ca)
        if device_id not in candidates:
            waiting = ", ".join(sorted(candidates)) or "none"
            raise EnrollmentError(f"device {device_id!r} has not announced a key on {broker}; seen: {waiting}")
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
