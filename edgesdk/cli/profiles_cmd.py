"""``edgesdk profiles list|show|import-measurements``: the devices edgesdk knows."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from edgesdk.cli.output import json_option, print_json, print_table, profiles_dirs
from edgesdk.errors import ProfileError
from edgesdk.profiles import get_profile, load_profiles


@click.group()
def profiles() -> None:
    """Device profiles: what each device can run and how hot it may get."""


@profiles.command("list")
@json_option
@click.pass_context
def list_profiles(ctx: click.Context, as_json: bool) -> None:
    """List every known device profile."""
    found = load_profiles(profiles_dirs(ctx))
    if as_json:
        print_json([p.model_dump(mode="json") for p in found.values()])
        return
    rows = [
        (
            p.name,
            f"{p.cpu.arch} ×{p.cpu.cores}",
            f"{p.memory.ram_mb / 1024:g} GB",
            " ".join(a.kind for a in p.accelerators) or "-",
            " ".join(r.runtime.value for r in p.runtimes),
            f"{p.thermal.step_down_c:g}/{p.thermal.throttle_c:g}",
        )
        for p in found.values()
    ]
    print_table(
        f"{len(rows)} device profiles",
        ["name", "cpu", "ram", "accel", "runtimes", "°C down/throttle"],
        rows,
    )


@profiles.command("show")
@click.argument("name")
@json_option
@click.pass_context
def show_profile(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show one profile in full (YAML, or JSON with --json)."""
    profile = get_profile(name, profiles_dirs(ctx))
    data = profile.model_dump(mode="json", exclude_none=False)
    if as_json:
        print_json(data)
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip())


@profiles.command("import-measurements")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write PROFILE.yaml into (then use it with --profiles-dir).",
)
@click.option("--profile", "profile_name", default=None, help="Profile to add them to (default: the files' own).")
@click.pass_context
def import_measurements(ctx: click.Context, files: tuple[Path, ...], out_dir: Path, profile_name: str | None) -> None:
    """Add what devices measured on themselves (edge-agent profile: DATA_DIR/measurements.json)
    to their profile's measured: section; an entry for the same device, model and release is replaced."""
    from edgesdk.schemas.measurements import DeviceMeasurements

    documents = []
    for path in files:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ProfileError(f"measurements file {str(path)!r} cannot be read: {exc.strerror or exc}") from exc
        documents.append(DeviceMeasurements.parse_json_clear(raw, source=str(path)))
    named = sorted({d.profile for d in documents})
    if profile_name is None and len(named) > 1:
        raise ProfileError(f"the files are for several profiles ({', '.join(named)}); pass --profile NAME")
    profile = get_profile(profile_name or named[0], profiles_dirs(ctx))
    key = {(d.device_id, d.model, d.release) for d in documents}
    kept = [m for m in profile.measured if (m.device_id, m.model, m.release) not in key]
    # Standalone (no extends): the written file is the whole profile, figures included.
    updated = profile.model_copy(update={"measured": [*kept, *documents], "extends": None})
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / f"{profile.name}.yaml"
        target.write_text(
            yaml.safe_dump(updated.model_dump(mode="json"), sort_keys=False, allow_unicode=True), encoding="utf-8"
        )
    except OSError as exc:
        raise ProfileError(f"cannot write the profile into {str(out_dir)!r}: {exc.strerror or exc}") from exc
    click.echo(
        f"{profile.name}: {len(documents)} measurement set(s) imported, {len(updated.measured)} in all -> {target}"
    )
