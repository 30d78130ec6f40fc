"""Entry point of the ``edgesdk`` command.

Subcommands are registered by name → ``"module:attribute"`` and imported only when run,
so ``edgesdk profiles list`` never imports torch or a runtime. Every error a user can
cause ends as one line on stderr and a non-zero exit; tracebacks are for bugs only
(set ``EDGESDK_DEBUG=1`` to see the chained cause of an error).

Exit status, for ``edgesdk`` and ``edge-agent`` alike: see :mod:`edgesdk.console`
(``run_cli``, shared with the device's command).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from edgesdk._version import __version__
from edgesdk.console import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, run_cli

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "cli", "main", "run_cli"]

# Grouped by user: everyone, embedded developers, fleet operators, newcomers.
COMMANDS: dict[str, str] = {
    "profiles": "edgesdk.cli.profiles_cmd:profiles",
    "schema": "edgesdk.cli.schema_cmd:schema",
    "demo": "edgesdk.cli.demo_cmd:demo",
    "convert": "edgesdk.cli.convert_cmd:convert",
    "image": "edgesdk.cli.image_cmd:image",
    "fleet": "edgesdk.cli.fleet_cmd:fleet",
    "keys": "edgesdk.cli.keys_cmd:keys",
    "trust": "edgesdk.cli.trust_cmd:trust",
    "package": "edgesdk.cli.package_cmd:package",
    "bundle": "edgesdk.cli.bundle_cmd:bundle",
    "capture": "edgesdk.cli.capture_cmd:capture",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module_name, attr = self.lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attr)
            if not isinstance(command, click.Command):
                raise TypeError(f"{self.lazy[cmd_name]} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in self.list_commands(ctx):
            raise click.UsageError(f"unknown command {name!r}; known: {', '.join(self.list_commands(ctx))}")
        return super().resolve_command(ctx, args)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="edgesdk", message="%(prog)s %(version)s")
@click.option(
    "--profiles-dir",
    "profiles_dirs",
    multiple=True,
    type=click.Path(file_okay=False, path_type=str),
    help="Extra directory of device profiles (repeatable); also EDGESDK_PROFILE_PATH.",
)
@click.pass_context
def cli(ctx: click.Context, profiles_dirs: tuple[str, ...]) -> None:
    """edgesdk: package models for edge devices, run them offline, update fleets.

    \b
    Everyone:            profiles, schema, demo
    Embedded developers: convert, package, bundle, keys
    Fleet operators:     fleet, image, trust, capture
    """
    ctx.ensure_object(dict)
    ctx.obj["profiles_dirs"] = list(profiles_dirs)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point for ``edgesdk``."""
    sys.exit(run_cli(cli, argv, prog_name="edgesdk"))


if __name__ == "__main__":
    main()
