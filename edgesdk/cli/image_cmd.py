"""``edgesdk image build``: an offline provisioning image for a device profile."""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk.cli.output import json_option, print_json, profiles_dirs
from edgesdk.image.builder import DEVICE_EXTRAS, ImageOptions, build_image
from edgesdk.profiles import get_profile

_FILE = click.Path(dir_okay=False, path_type=Path)


@click.group()
def image() -> None:
    """Provisioning images: install the agent on a device with no network."""


@image.command("build")
@click.option("--profile", "profile_name", required=True, help="Device profile, e.g. rpi5-8gb.")
@click.option("--broker", required=True, help="MQTT broker the devices connect to: mqtt[s]://HOST[:PORT].")
@click.option("--out", required=True, type=_FILE, help="Image file to write (IMAGE.tar.gz).")
@click.option("--bundle", type=_FILE, help="Initial model bundle (.edgepkg) to ship in the image.")
@click.option("--ca", type=_FILE, help="CA certificate (PEM) the devices trust for mqtts://.")
@click.option(
    "--publisher-key",
    "publisher_keys",
    multiple=True,
    type=_FILE,
    help="Trusted publisher public key (PEM); repeatable. Needed to verify bundles.",
)
@click.option(
    "--trust-document",
    type=_FILE,
    help="Root-signed trust document (edgesdk trust sign): publisher keys verify bundles, operator keys "
    "deployments. Shipped as /etc/edgesdk/trust.json and set in the config.",
)
@click.option("--group", "groups", multiple=True, help="Fleet group every device joins (repeatable).")
@click.option("--namespace", default="edgesdk", show_default=True, help="MQTT topic namespace.")
@click.option("--api-port", default=8470, show_default=True, type=click.IntRange(0, 65535), help="Local API port.")
@click.option(
    "--extra",
    "extras",
    multiple=True,
    type=click.Choice(DEVICE_EXTRAS),
    help="Add a device runtime to the wheelhouse (onnxruntime is always in).",
)
@click.option("--family", help="Firmware recipe to use instead of the one matching the profile.")
@click.option("--agent-wheel", type=_FILE, help="Use this edgesdk wheel instead of building one from the checkout.")
@json_option
@click.pass_context
def build(
    ctx: click.Context,
    profile_name: str,
    broker: str,
    out: Path,
    bundle: Path | None,
    ca: Path | None,
    publisher_keys: tuple[Path, ...],
    trust_document: Path | None,
    groups: tuple[str, ...],
    namespace: str,
    api_port: int,
    extras: tuple[str, ...],
    family: str | None,
    agent_wheel: Path | None,
    as_json: bool,
) -> None:
    """Build an offline provisioning image (wheelhouse, overlay, config, install.sh)."""
    options = ImageOptions(
        profile=get_profile(profile_name, profiles_dirs(ctx)),
        broker=broker,
        out=out,
        bundle=bundle,
        ca=ca,
        publisher_keys=list(publisher_keys),
        trust_document=trust_document,
        groups=list(groups),
        namespace=namespace,
        api_port=api_port,
        extras=list(extras),
        family=family,
        agent_wheel=agent_wheel,
    )
    # Plain lines on stderr (stdout stays clean for --json); no wrapping of long paths.
    built = build_image(options, progress=lambda line: click.echo(line, err=True))
    if as_json:
        print_json(
            {"path": str(built.path), "seconds": round(built.seconds, 1), **built.manifest.model_dump(mode="json")}
        )
