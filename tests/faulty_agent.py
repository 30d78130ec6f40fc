"""The real device agent with faults planted in its updater — for integration tests only.

    python -m tests.faulty_agent --config agent.toml --kill-at STAGED
    python -m tests.faulty_agent --config agent.toml --disk-full download

It loads the config and runs :class:`edgesdk.agent.daemon.Agent` the way ``edge-agent run``
does (same config loading, logging, error handling and exit codes); the only difference is the
:class:`FaultPlan` it hands to the agent through ``Agent(ota_hooks=...)``. Production code reads
no fault-injection setting, so this module is the one way to plant these faults in a real process.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
from pathlib import Path

import click
from edgesdk.agent.ota.hooks import OtaHooks, WriteKind
from edgesdk.agent.ota.states import UpdateState

log = logging.getLogger(__name__)

WRITE_KINDS: tuple[WriteKind, ...] = ("download", "stage")


class FaultPlan(OtaHooks):
    """Faults for one agent: a SIGKILL right after a state is persisted, a full disk at a write.

    ``disk_full`` is a set the test may change while the agent runs ("space is back"); with
    ``once``, each write kind fails the first time only (space is back for the next update)."""

    def __init__(
        self, *, kill_at: UpdateState | None = None, disk_full: set[WriteKind] | None = None, once: bool = False
    ) -> None:
        self.kill_at = kill_at
        self.disk_full: set[WriteKind] = set(disk_full or ())
        self.once = once

    def after_state_saved(self, state: UpdateState) -> None:
        if state is self.kill_at:
            log.warning("fault plan: killing the agent right after %s was persisted", state.value)
            # SIGKILL, not an exception: nothing may run after the save (no finally, no atexit),
            # exactly like a power loss.
            os.kill(os.getpid(), signal.SIGKILL)

    def before_write(self, kind: WriteKind, path: Path, size: int) -> None:
        if kind in self.disk_full:
            if self.once:
                self.disk_full.discard(kind)
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected by the fault plan)", str(path))


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option(
    "--kill-at",
    # IDLE is never saved by an update, so it is no kill point.
    type=click.Choice([s.value for s in UpdateState if s is not UpdateState.IDLE]),
    default=None,
    help="SIGKILL the agent right after this update state is persisted.",
)
@click.option(
    "--disk-full",
    type=click.Choice(WRITE_KINDS),
    multiple=True,
    help="Fail this updater write with ENOSPC (repeatable).",
)
@click.option("--disk-full-once", is_flag=True, help="Each --disk-full write fails the first time only.")
def run(config_path: Path, kill_at: str | None, disk_full: tuple[WriteKind, ...], disk_full_once: bool) -> None:
    """Run the agent until SIGTERM, with the faults planted."""
    from edgesdk.agent.config import load_config
    from edgesdk.agent.daemon import Agent
    from edgesdk.agent.logs import setup_logging

    config = load_config(config_path)
    setup_logging(config.log_level, config.log_format)
    plan = FaultPlan(kill_at=UpdateState(kill_at) if kill_at else None, disk_full=set(disk_full), once=disk_full_once)
    code = Agent(config, ota_hooks=plan).run()
    if code:
        raise click.exceptions.Exit(code)


REPO_ROOT = Path(__file__).resolve().parents[1]


def faulty_agent_argv(
    config: Path,
    *,
    kill_at: UpdateState | None = None,
    disk_full: tuple[WriteKind, ...] = (),
    disk_full_once: bool = False,
) -> list[str]:
    """The command line that runs this harness (for ``AgentProcess(argv=...)``)."""
    argv = [sys.executable, "-m", "tests.faulty_agent", "--config", str(config)]
    if kill_at is not None:
        argv += ["--kill-at", kill_at.value]
    for kind in disk_full:
        argv += ["--disk-full", kind]
    if disk_full_once:
        argv.append("--disk-full-once")
    return argv


def faulty_agent_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the repository root importable, so ``-m tests.faulty_agent`` works from any cwd."""
    paths = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def main(argv: list[str] | None = None) -> None:
    from edgesdk.console import run_cli

    sys.exit(run_cli(run, argv, prog_name="faulty-agent"))


if __name__ == "__main__":
    main()
