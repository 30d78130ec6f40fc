"""The updater's test seams, passed in by whoever builds the agent; production passes none.

Fault injection (a power loss right after a state is persisted, a disk that fills up during the
download or the staging copy) must be reachable from tests that run the real agent, but it must
never be reachable from the device's environment: a stray variable on a fleet of devices could
kill every agent mid-update. So the seams are an object handed to ``Agent(ota_hooks=...)`` and
``UpdateManager(hooks=...)`` in code — the test harness ``tests/faulty_agent.py`` does that — and
the defaults here do nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from edgesdk.agent.ota.states import UpdateState

#: Which updater write is about to happen: reserving the download file, copying into a slot.
WriteKind = Literal["download", "stage"]


class OtaHooks:
    """Override the methods a test needs; every default is a no-op."""

    def after_state_saved(self, state: UpdateState) -> None:
        """Called right after ``state`` is persisted, before its work starts (power-loss point)."""

    def before_write(self, kind: WriteKind, path: Path, size: int) -> None:
        """Called before the updater writes ``size`` bytes for ``kind`` at ``path``.

        Raising ``OSError`` here is handled exactly like the write itself failing (for
        ``errno.ENOSPC``: the update fails with a disk-full reason and the old model serves on)."""


#: What production code uses when nobody passes hooks.
NO_HOOKS = OtaHooks()
