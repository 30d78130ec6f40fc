"""``edgesdk bundle inspect|verify``: look inside a bundle, or check it as a device would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgesdk.bundle import inspect_bundle
from edgesdk.cli.output import json_option, print_json, print_table, profiles_dirs
from edgesdk.schemas.manifest import BundleManifest
from edgesdk.toolchain import verify_bundle

_bundle_argument = click.argument("bundle_file", type=click.Path(dir_okay=False, path_type=Path))


@click.group()
def bundle() -> None:
    """Model bundles: inspect their contents, verify them as a device would."""


def _summary(manifest: BundleManifest) -> dict[str, Any]:
    return {
        "name": manifest.model.name,
        "version": manifest.model.version,
        "release": manifest.model.release,
        "publisher": f"{manifest.publisher.name} ({manifest.publisher.key_id})",
        "created": manifest.created.isoformat(),
        "expires": manifest.expires.isoformat() if manifest.expires else "never",
        "targets": ", ".join(manifest.targets),
        "downgrade": (
            f"from releases {manifest.downgrade.from_releases[0]}-{manifest.downgrade.from_releases[1]} "
            f"until {manifest.downgrade.expires_at.isoformat()}"
            if manifest.downgrade
            else "no"
        ),
        "recipients": ", ".join(f"{s.recipient} ({s.kind})" for s in manifest.encryption.key_slots)
        if manifest.encryption
        else "",
    }


def _variant_rows(manifest: BundleManifest) -> list[tuple[Any, ...]]:
    rows = []
    for v in manifest.variants:
        accuracy = f"{v.accuracy.metric} {v.accuracy.value:.4f} (gate {v.accuracy.gate:g})" if v.accuracy else "-"
        rows.append(
            (
                v.id,
                v.format.value,
                v.precision.value,
                v.runtime.value,
                v.size,
                ", ".join(f.name for f in v.files),
                accuracy,
            )
        )
    return rows


_VARIANT_COLUMNS = ["variant", "format", "precision", "runtime", "bytes", "files", "accuracy"]


@bundle.command("inspect")
@_bundle_argument
@json_option
def inspect(bundle_file: Path, as_json: bool) -> None:
    """Show a bundle's manifest. Nothing is verified: use `bundle verify` before trusting it."""
    info = inspect_bundle(bundle_file)
    if as_json:
        print_json(
            {
                "verified": False,
                "path": str(bundle_file),
                "size": info.size,
                "signed_by_key_id": info.publisher_key_id,
                "manifest": info.manifest.model_dump(mode="json", exclude_none=True),
            }
        )
        return
    rows = [("file", f"{bundle_file} ({info.size} bytes)"), ("signature", "NOT CHECKED (use: edgesdk bundle verify)")]
    rows += list(_summary(info.manifest).items())
    print_table("bundle (unverified)", ["field", "value"], rows)
    print_table("variants", _VARIANT_COLUMNS, _variant_rows(info.manifest))


@bundle.command("verify")
@_bundle_argument
@click.option(
    "--publisher-pub",
    "publisher_pubs",
    multiple=True,
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Trusted publisher public key; repeatable.",
)
@click.option(
    "--device-key",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Device private key: also decrypt every variant in memory and check its hashes.",
)
@click.option("--profile", help="The device's profile: the bundle must target it.")
@click.option(
    "--installed-release",
    type=click.IntRange(min=0),
    default=None,
    help="Release counter installed now: an older or equal bundle is a rollback.",
)
@json_option
@click.pass_context
def verify(
    ctx: click.Context,
    bundle_file: Path,
    publisher_pubs: tuple[Path, ...],
    device_key: Path | None,
    profile: str | None,
    installed_release: int | None,
    as_json: bool,
) -> None:
    """Check a bundle as a device would: signature, hashes, expiry, target, release.

    Nothing is written: decrypted variants (with --device-key) stay in memory."""
    result = verify_bundle(
        bundle_file,
        trusted_publishers=publisher_pubs,
        device_key=device_key,
        profile=profile or None,
        installed_release=installed_release,
        profiles_dirs=profiles_dirs(ctx),
    )
    verified = result.bundle
    decrypted = {variant: f"ok ({part.files} file(s), {part.size} bytes)" for variant, part in result.decrypted.items()}
    if result.golden_arrays is not None:
        decrypted["golden"] = f"ok ({result.golden_arrays} arrays)"
    checks = list(result.checks)
    if as_json:
        print_json(
            {
                "verified": True,
                "path": str(bundle_file),
                "sha256": verified.sha256,
                "checks": checks,
                "decrypted": decrypted,
                "manifest": verified.manifest.model_dump(mode="json", exclude_none=True),
            }
        )
        return
    rows = [("result", "VERIFIED"), ("checked", ", ".join(checks)), ("sha256", verified.sha256)]
    rows += list(_summary(verified.manifest).items())
    rows += [(f"decrypt {k}", v) for k, v in decrypted.items()]
    print_table(f"bundle {bundle_file}", ["field", "value"], rows)
