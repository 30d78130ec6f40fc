"""``edgesdk profiles list|show``: the devices edgesdk knows."""

from __future__ import annotations

import click
import yaml

from edgesdk.cli.output import json_option, print_json, print_table, profiles_dirs
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
