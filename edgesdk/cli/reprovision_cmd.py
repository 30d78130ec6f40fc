"""``edgesdk fleet reprovision DEVICE``: sign and publish a re-provision command.

A device reported ``security_state_tampered`` refuses installs and commands until its security
state is re-provisioned (docs/ota.md, "Re-provisioning a tampered device"). This command signs
a :class:`~edgesdk.protocol.reprovision.Reprovision` with the operator key (as deployments are
signed), bound to the device id and its key id, and publishes it on the device's
``ota/reprovision`` topic at QoS 1 (not retained: the device must be online).
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click

from edgesdk.cli.fleet_cmd import broker_options
from edgesdk.cli.fleet_rollout_cmd import _key_option, _operator_key
from edgesdk.cli.rollout_options import positive_duration
from edgesdk.errors import LinkError, UsageError


def _floors(items: tuple[str, ...]) -> dict[str, int]:
    floors: dict[str, int] = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value.isdigit() or int(value) >= 2**31:
            raise UsageError(f"bad --floor {item!r}: MODEL=RELEASE (e.g. --floor digits=3)")
        floors[name] = int(value)
    return floors


def _trust_text(path: Path | None) -> str | None:
    if path is None:
        return None
    from edgesdk.trust.document import load_document

    load_document(path)  # a file that is not a trust document fails here, in one line
    return path.read_text()


@click.command("reprovision")
@click.argument("device_id")
@click.option("--key-id", required=True, help="The device key id (32 hex digits, what edge-agent key shows).")
@click.option("--floor", "floors", multiple=True, metavar="MODEL=RELEASE", help="A release floor (repeatable).")
@click.option(
    "--trust-document",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The fleet's trust document in force (the device checks it against its root).",
)
@click.option("--expires", default="1h", show_default=True, help="How long the command stays valid (1s..7d).")
@_key_option
@broker_options
def reprovision(
    device_id: str,
    key_id: str,
    floors: tuple[str, ...],
    trust_document: Path | None,
    expires: str,
    key_path: Path | None,
    **params: Any,
) -> None:
    """Tell DEVICE (reported tampered) to start a fresh security state at the stated floors."""
    from edgesdk.protocol import topics
    from edgesdk.protocol.reprovision import REPROVISION, Reprovision, sign_reprovision
    from edgesdk.protocol.signing import command_payload

    topic = topics.device_topic(params["namespace"], device_id, REPROVISION)  # a bad id fails here
    now = datetime.now(timezone.utc)
    try:
        command = Reprovision(
            deployment_id=f"reprovision-{uuid.uuid4().hex[:12]}",
            issued_at=now,
            expires_at=now + timedelta(seconds=positive_duration(expires)),
            sequence=int(time.time() * 1000),  # as the fleet issues deployments': its clock in ms
            targets=[device_id],
            key_id=key_id.lower(),
            release_floors=_floors(floors),
            trust_document=_trust_text(trust_document),
        )
    except ValueError as exc:
        raise UsageError(f"bad re-provision command: {str(exc).splitlines()[-1].strip()}") from None
    signed = sign_reprovision(command, _operator_key(key_path))
    _publish_once(params, topic, command_payload(signed))  # type: ignore[arg-type]
    click.echo(f"published {signed.deployment_id} to {device_id} (sequence {signed.sequence})")


def _publish_once(params: dict[str, Any], topic: str, payload: bytes) -> None:
    """Publish at QoS 1 and wait for the broker's acknowledgement."""
    from edgesdk.cli.fleet_cmd import client_options_from
    from edgesdk.mqtt.client import MqttClient

    options = client_options_from(params, f"edgesdk-reprovision-{uuid.uuid4().hex[:8]}")
    client = MqttClient(options)
    client.start()
    try:
        if not client.wait_connected(params["connect_timeout"]):
            raise LinkError(f"cannot connect to broker {params['broker']}: {client.stats.last_error or 'no answer'}")
        client.publish(topic, payload, qos=1)
        deadline = time.monotonic() + params["connect_timeout"]
        while client.stats.acked + client.stats.rejected < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        if client.stats.acked < 1:
            why = client.stats.last_error or "no acknowledgement"
            raise LinkError(f"broker {params['broker']} did not take the command on {topic}: {why}")
    finally:
        client.stop()
