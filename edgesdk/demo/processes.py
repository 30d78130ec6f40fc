"""Every process the demo starts, in one place, so that nothing outlives the demo.

Each child runs in its own session (process group): a Ctrl-C in the terminal reaches only the
demo, which then stops the children in order — SIGTERM to each group (agents drain their
requests), then SIGKILL to whatever is still there after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO


class ProcessSet:
    """Starts children in their own process groups and stops all of them."""

    def __init__(self) -> None:
        self._children: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []
        self._log_files: dict[str, Path] = {}

    def start(self, name: str, argv: Sequence[str], *, log_file: Path, env: dict[str, str] | None = None) -> int:
        """Start ``argv`` with stdout+stderr going to ``log_file``; returns its pid."""
        log = open(log_file, "ab")  # noqa: SIM115 - closed in stop_all()
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True
        )
        self._children.append((name, proc, log))
        self._log_files[name] = Path(log_file)
        return proc.pid

    def log_file(self, name: str) -> Path | None:
        """Where child ``name`` writes its stdout and stderr."""
        return self._log_files.get(name)

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc, _ in self._children}

    def exited(self) -> dict[str, int]:
        """Children that have already exited, with their exit status."""
        return {name: proc.returncode for name, proc, _ in self._children if proc.poll() is not None}

    def stop(self, name: str, *, grace_s: float = 10.0) -> int | None:
        """Stop one child (SIGTERM, then SIGKILL after ``grace_s``)."""
        for child_name, proc, _ in self._children:
            if child_name == name:
                _signal_group(proc, signal.SIGTERM)
                try:
                    return proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)
                    return proc.wait(5)
        return None

    def stop_all(self, *, grace_s: float = 10.0) -> None:
        """SIGTERM every group, wait up to ``grace_s`` in total, SIGKILL the rest. Never raises."""
        for _, proc, _ in self._children:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, proc, _ in self._children:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, proc, log in self._children:
            # Always the whole group: a child that exited may have left children of its own.
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            log.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the child's pid
    except (ProcessLookupError, PermissionError):
        pass
