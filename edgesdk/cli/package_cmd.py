"""``edgesdk package CONVERT_DIR ...``: a convert output → one signed, encrypted bundle."""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk.api import package as package_bundle
from edgesdk.api import parse_expiry
from edgesdk.bundle import inspect_bundle
from edgesdk.cli.output import json_option, print_json, print_table, profiles_dirs


@click.command("package")
@click.argument("convert_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", required=True, help="Model name (lower case, digits, . _ -).")
@click.option("--version", "version", required=True, help="Semantic version, e.g. 1.4.0.")
@click.option(
    "--release",
    type=click.IntRange(min=1),
    default=None,
    help="Monotonic release counter for anti-rollback (default: seconds since the Unix epoch, UTC).",
)
@click.option(
    "--publisher-key", required=True, type=click.Path(dir_okay=False, path_type=Path), help="publisher.key that signs."
)
@click.option(
    "--recipient",
    "recipients",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A device public key (device.pub) that may decrypt; repeatable.",
)
@click.option(
    "--recipient-group",
    "groups",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A group public key shared by several devices; repeatable.",
)
@click.option(
    "--recipients-from-registry",
    "registry",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also encrypt to every approved device of this enrollment registry (edgesdk fleet enroll).",
)
@click.option("--expires", default="never", show_default=True, help="90d, 12h, 4w, an ISO date, or never.")
@click.option(
    "--target", "targets", multiple=True, help="Device profile the bundle is for; repeatable (default: the report's)."
)
@click.option(
    "--allow-downgrade", is_flag=True, help="Sign permission to install over a newer release (explicit downgrade)."
)
@click.option("--publisher-name", default="edgesdk-publisher", show_default=True, help="Shown to operators.")
@click.option("--description", default="", help="Free text stored in the manifest.")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="FILE.edgepkg to write.")
@json_option
@click.pass_context
def package(
    ctx: click.Context,
    convert_dir: Path,
    name: str,
    version: str,
    release: int | None,
    publisher_key: Path,
    recipients: tuple[Path, ...],
    groups: tuple[Path, ...],
    registry: Path | None,
    expires: str,
    targets: tuple[str, ...],
    allow_downgrade: bool,
    publisher_name: str,
    description: str,
    out: Path,
    as_json: bool,
) -> None:
    """Sign and encrypt the variants of CONVERT_DIR (an `edgesdk convert` output) into one bundle."""
    path = package_bundle(
        convert_dir,
        name=name,
        version=version,
        release=release,
        publisher_key=publisher_key,
        recipients=recipients,
        group_recipients=groups,
        registry=registry,
        targets=targets,
        expires=parse_expiry(expires, option="--expires"),
        allow_downgrade=allow_downgrade,
        out=out,
        publisher_name=publisher_name,
        description=description,
        profiles_dirs=profiles_dirs(ctx),
    )
    manifest = inspect_bundle(path).manifest
    summary = {
        "bundle": str(path),
        "size": path.stat().st_size,
        "name": manifest.model.name,
        "version": manifest.model.version,
        "release": manifest.model.release,
        "targets": manifest.targets,
        "expires": manifest.expires.isoformat() if manifest.expires else None,
        "variants": [v.id for v in manifest.variants],
        "recipients": [s.recipient for s in manifest.encryption.key_slots] if manifest.encryption else [],
    }
    if as_json:
        print_json(summary)
        return
    print_table(f"packaged {path}", ["field", "value"], [(k, v) for k, v in summary.items()])
