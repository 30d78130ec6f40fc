"""Entry point of the ``edgesdk`` command.

Subcommands are registered by name → ``"module:attribute"`` and imported only when run,
so ``edgesdk profiles list`` never imports torch or a runtime. Every error a user can
cause ends as one line on stderr and a non-zero exit; tracebacks are for bugs only
(set ``EDGESDK_DEBUG=1`` to see the chained cause of an error).

Exit status, for ``edgesdk`` and ``edge-agent`` alike (both run through :func:`run_cli`):
0 success; 2 a usage error (an unknown command or option, a missing or malformed argument:
the command line itself is wrong, as click and most Unix tools mean it); 1 every other error
(a missing file, an unknown profile, a failed check); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from edgesdk._version import __version__
from edgesdk.errors import EdgeSDKError

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
}

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


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
    Fleet operators:     fleet, image, trust
    """
    ctx.ensure_object(dict)
    ctx.obj["profiles_dirs"] = list(profiles_dirs)


def run_cli(command: click.Command, argv: list[str] | None = None, prog_name: str | None = None) -> int:
    """Run a click command; turn every expected error into one line and an exit code."""
    try:
        command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except EdgeSDKError as exc:
        click.echo(f"error: {exc}", err=True)
        if os.environ.get("EDGESDK_DEBUG"):
            raise
        return EXIT_ERROR
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.Abort:
        click.echo("error: aborted", err=True)
        return EXIT_INTERRUPTED
    except click.exceptions.NoArgsIsHelpError as exc:
        # A group run without its subcommand: the help is the answer, not an "error: Usage: ..." block.
        click.echo(exc.format_message(), err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        return EXIT_USAGE if isinstance(exc, click.UsageError) else exc.exit_code
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_ERROR
    return 0


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point for ``edgesdk``."""
    sys.exit(run_cli(cli, argv, prog_name="edgesdk"))


if __name__ == "__main__":
    main()
