"""``edgesdk trust sign|show|push``: the root-signed document naming publisher and operator keys.

    edgesdk keys root --out root/                      (once; keep root.key offline)
    edgesdk trust sign --root-key root/root.key --publisher-key pub/publisher.pub \\
        --operator-key ops/publisher.pub --version 1 --expires 365d -o trust.json
    edgesdk trust sign --previous trust.json --root-key root/root.key ... -o trust-v2.json
    edgesdk trust show trust.json [--json]
    edgesdk trust push trust-v2.json --broker mqtt://fleet:1883

A rotation (``--previous``) must be signed by enough of the previous root's keys and of the
new root's: pass every root key that signs with ``--root-key``, and the new root's public keys
with ``--root-pub`` when they differ from the signing keys.
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click

from edgesdk.cli.fleet_cmd import broker_options
from edgesdk.cli.output import json_option, print_json, print_table
from edgesdk.errors import LinkError, UsageError

_EXPIRES = re.compile(r"^(\d+)\s*([dh])$")
_file = click.Path(dir_okay=False, path_type=Path)


@click.group()
def trust() -> None:
    """Trust documents: which keys may sign bundles (publisher) and deployments (operator)."""


def parse_expires(text: str, *, now: datetime) -> datetime:
    """``"365d"``, ``"12h"`` or an ISO date/time (UTC when no offset) → an aware datetime."""
    match = _EXPIRES.match(text.strip())
    if match:
        amount, unit = int(match.group(1)), match.group(2)
        if amount <= 0:
            raise UsageError(f"bad --expires {text!r}: must be in the future")
        return now + (timedelta(days=amount) if unit == "d" else timedelta(hours=amount))
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"bad --expires {text!r}: expected e.g. 365d, 12h or 2027-01-31T00:00:00Z") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


@trust.command("sign")
@click.option("--root-key", "root_keys", multiple=True, type=_file, help="Root private key that signs; repeatable.")
@click.option(
    "--root-pub",
    "root_pubs",
    multiple=True,
    type=_file,
    help="Public key of the document's root role; repeatable (default: the public halves of --root-key).",
)
@click.option("--root-threshold", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--publisher-key", "publisher_keys", multiple=True, type=_file, help="Publisher public key; repeatable.")
@click.option("--operator-key", "operator_keys", multiple=True, type=_file, help="Operator public key; repeatable.")
@click.option("--version", "version", type=click.IntRange(min=1), default=None, help="Default: previous + 1.")
@click.option("--expires", default="365d", show_default=True, help="365d, 12h, or an ISO date/time.")
@click.option("--previous", type=_file, default=None, help="The document this one replaces (rotation, revocation).")
@click.option("-o", "--output", "output", type=_file, required=True, help="Where to write the signed document.")
@json_option
def sign(
    root_keys: tuple[Path, ...],
    root_pubs: tuple[Path, ...],
    root_threshold: int,
    publisher_keys: tuple[Path, ...],
    operator_keys: tuple[Path, ...],
    version: int | None,
    expires: str,
    previous: Path | None,
    output: Path,
    as_json: bool,
) -> None:
    """Write a trust document signed by the given root keys (checked before it is written)."""
    from edgesdk.keys import load_publisher_private_key, load_publisher_public_key
    from edgesdk.schemas.trust import TrustDocument
    from edgesdk.trust import document_bytes, load_document, role_of, sign_document, verify_self, verify_update

    for flag, values in (
        ("--root-key", root_keys),
        ("--publisher-key", publisher_keys),
        ("--operator-key", operator_keys),
    ):
        if not values:
            raise UsageError(f"{flag} is required (repeat it for several keys)")
    if output.exists():
        raise UsageError(f"{output} already exists; refusing to overwrite (move it away or pick another -o)")
    before = load_document(previous) if previous is not None else None
    if version is None:
        if before is None:
            raise UsageError("--version is required for a first document (no --previous)")
        version = before.version + 1
    signing = [load_publisher_private_key(path) for path in root_keys]
    root_public = [load_publisher_public_key(path) for path in root_pubs] or [k.public_key() for k in signing]
    now = datetime.now(timezone.utc)
    document = TrustDocument.parse_obj_clear(
        {
            "version": version,
            "expires_at": parse_expires(expires, now=now),
            "roles": {
                "root": role_of(root_public, root_threshold),
                "publisher": role_of(load_publisher_public_key(path) for path in publisher_keys),
                "operator": role_of(load_publisher_public_key(path) for path in operator_keys),
            },
        },
        source="trust document",
    )
    signed = sign_document(document, signing)
    # What a device would check, now: better an error here than a fleet that refuses the file.
    if before is not None:
        verify_update(before, signed, now=now)
    else:
        verify_self(signed)
    try:
        output.write_bytes(document_bytes(signed))
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from exc
    summary = _summary(signed, output)
    if as_json:
        print_json(summary)
    else:
        click.echo(
            f"wrote {output}: trust document version {signed.version}, expires {signed.expires_at.isoformat()}, "
            f"signed by {len(signed.signatures)} root key(s)"
        )


def _summary(document: Any, path: Path) -> dict[str, Any]:
    from edgesdk.trust import valid_signers

    expired = document.is_expired(datetime.now(timezone.utc))
    return {
        "path": str(path),
        "version": document.version,
        "expires_at": document.expires_at.isoformat(),
        "expired": expired,
        "roles": {
            name: {"threshold": role.threshold, "keys": sorted(role.keys)}
            for name, role in (
                ("root", document.roles.root),
                ("publisher", document.roles.publisher),
                ("operator", document.roles.operator),
            )
        },
        "signatures": sorted(entry.split(":")[1] for entry in document.signatures if entry.count(":") == 2),
        "self_signed_ok": len(valid_signers(document, document.roles.root)) >= document.roles.root.threshold,
    }


@trust.command("show")
@click.argument("document_path", type=_file)
@json_option
def show(document_path: Path, as_json: bool) -> None:
    """Show a trust document: version, expiry, keys per role, and whether its root signatures hold."""
    from edgesdk.trust import load_document

    summary = _summary(load_document(document_path), document_path)
    if as_json:
        print_json(summary)
        return
    rows: list[tuple[str, str]] = [
        ("version", str(summary["version"])),
        ("expires at", summary["expires_at"] + ("  (EXPIRED)" if summary["expired"] else "")),
    ]
    for name, role in summary["roles"].items():
        rows.append((f"{name} (threshold {role['threshold']})", "\n".join(role["keys"])))
    rows.append(("signed by", "\n".join(summary["signatures"]) or "nobody"))
    rows.append(("root signatures", "valid" if summary["self_signed_ok"] else "NOT ENOUGH VALID ROOT SIGNATURES"))
    print_table(f"trust document {document_path}", ["field", "value"], rows)


@trust.command("push")
@click.argument("document_path", type=_file)
@broker_options
@json_option
def push(document_path: Path, as_json: bool, **broker: Any) -> None:
    """Publish the document retained on the fleet's trust topic; devices verify and install it."""
    from edgesdk.cli.fleet_cmd import client_options_from
    from edgesdk.mqtt.client import MqttClient
    from edgesdk.protocol.topics import TRUST, fleet_topic
    from edgesdk.trust import document_bytes, load_document, verify_self

    document = load_document(document_path)
    verify_self(document)  # a document its own root does not sign would be refused by every device
    topic = fleet_topic(broker["namespace"], TRUST)
    client = MqttClient(client_options_from(broker, f"edgesdk-trust-push-{uuid.uuid4().hex[:8]}"))
    acked: list[bool] = []
    client.on_published = lambda _mid, ok: acked.append(ok)
    client.start()
    timeout = float(broker.get("connect_timeout") or 5.0)
    try:
        if not client.wait_connected(timeout):
            raise LinkError(f"cannot connect to broker {broker['broker']}: {client.stats.last_error or 'no answer'}")
        client.publish(topic, document_bytes(document), qos=1, retain=True)
        deadline = time.monotonic() + timeout
        while not acked and time.monotonic() < deadline:
            time.sleep(0.02)
        if not acked or not acked[0]:
            raise LinkError(f"broker {broker['broker']} did not acknowledge the trust document on {topic}")
    finally:
        client.stop()
    if as_json:
        print_json({"topic": topic, "version": document.version, "retained": True})
    else:
        click.echo(f"published trust document version {document.version} (retained) on {topic}")
