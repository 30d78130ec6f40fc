"""UpdateManager.holding_off_updates: the fence between an update and a reload of the committed
model (the daemon's measured-ladder reload after profiling). Without it, profiling that ended
while the next release was in probation reloaded the committed slot over it, and the probation
failed with "the new model is not serving" (seen in the demo's v3 rollout)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit


class _Keyring:
    trusted_operators: list[Any] = []


def _manager(tmp_path: Path) -> Any:
    from edgesdk.agent.ota.manager import UpdateManager

    return UpdateManager(
        tmp_path / "ota", device_id="a", serving=None, slots=None, keyring=_Keyring(), profile_name=None,  # type: ignore[arg-type]
        link=None, events=None,  # type: ignore[arg-type]
    )  # fmt: skip


def test_an_update_arriving_during_the_block_waits_for_it(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    ran = threading.Event()
    with manager.holding_off_updates() as idle:
        assert idle
        submitter = threading.Thread(target=manager._submit, args=(ran.set,))
        submitter.start()
        assert not ran.wait(0.3)  # the update's work cannot start inside the block
    submitter.join(5)
    assert ran.wait(5) and manager.wait_idle(5)


def test_the_block_learns_that_an_update_is_running(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    release = threading.Event()
    manager._submit(lambda: release.wait(5))
    try:
        with manager.holding_off_updates() as idle:
            assert not idle
    finally:
        release.set()
    assert manager.wait_idle(5)
    with manager.holding_off_updates() as idle:
        assert idle
