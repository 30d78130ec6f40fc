"""``edgesdk keys publisher|root|device|id``: make signing, root and device keys, show key ids."""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import KeyFileError
from edgesdk.keys import (
    generate_device_key,
    generate_publisher_key,
    generate_root_key,
    key_id,
    load_device_public_key,
    load_publisher_public_key,
)

_out_option = click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the key pair (created if missing; existing keys are never overwritten).",
)


@click.group()
def keys() -> None:
    """Keys: publisher keys sign bundles, root keys sign trust documents, device keys receive bundles."""


def _report(kind: str, priv: Path, pub: Path, identifier: str, as_json: bool) -> None:
    if as_json:
        print_json({"kind": kind, "private_key": str(priv), "public_key": str(pub), "key_id": identifier})
        return
    print_table(
        f"new {kind} key",
        ["file", "path"],
        [("private (0600, keep secret)", priv), ("public", pub), ("key id", identifier)],
    )


@keys.command("publisher")
@_out_option
@json_option
def publisher(out_dir: Path, as_json: bool) -> None:
    """Make an Ed25519 publisher key pair (publisher.key signs, publisher.pub goes to devices)."""
    priv, pub = generate_publisher_key(out_dir)
    _report("publisher", priv, pub, key_id(load_publisher_public_key(pub)), as_json)


@keys.command("root")
@_out_option
@json_option
def root(out_dir: Path, as_json: bool) -> None:
    """Make an Ed25519 root key pair: root.key signs trust documents (keep it offline), root.pub goes in them."""
    priv, pub = generate_root_key(out_dir)
    _report("root", priv, pub, key_id(load_publisher_public_key(pub)), as_json)


@keys.command("device")
@_out_option
@json_option
def device(out_dir: Path, as_json: bool) -> None:
    """Make an X25519 device (or group) key pair; only device.pub leaves the device."""
    priv, pub = generate_device_key(out_dir)
    _report("device", priv, pub, key_id(load_device_public_key(pub)), as_json)


@keys.command("id")
@click.argument("public_key", type=click.Path(dir_okay=False, path_type=Path))
@json_option
def show_id(public_key: Path, as_json: bool) -> None:
    """Print the key id of a publisher or device public key (how bundles name keys)."""
    try:
        key = load_publisher_public_key(public_key)
        kind = "publisher"
    except KeyFileError:
        key = load_device_public_key(public_key)  # type: ignore[assignment]
        kind = "device"
    if as_json:
        print_json({"kind": kind, "key_id": key_id(key), "path": str(public_key)})
    else:
        click.echo(f"{key_id(key)}  {kind}  {public_key}")
