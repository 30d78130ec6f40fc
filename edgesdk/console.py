"""How both commands end: ``edgesdk`` on the host and ``edge-agent`` on the device.

Exit status, for both (each runs its click command through :func:`run_cli`):
0 success; 2 a usage error (an unknown command or option, a missing or malformed argument:
the command line itself is wrong, as click and most Unix tools mean it); 1 every other error
(a missing file, an unknown profile, a failed check); 130 interrupted (Ctrl-C).

It lives in the shared core, not in ``edgesdk.cli``, because the device's command must not
import the host's command line (``tests/unit/test_layering.py``).
"""

from __future__ import annotations

import os

import click

from edgesdk.errors import EdgeSDKError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


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
