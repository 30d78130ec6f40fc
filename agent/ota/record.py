"""The persisted update record and its atomic file.

One JSON file, ``<data_dir>/ota/state.json``, written with write-temp, fsync, rename, fsync-dir:
after a power loss it holds either the previous record or the new one, never a torn mix.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from pathlib import Path

from edgesdk.agent.ota.states import UpdateState
from pydantic import Field, ValidationError

from edgesdk.schemas.base import Schema
from edgesdk.schemas.messages import Deployment

log = logging.getLogger(__name__)


class UpdateRecord(Schema):
    """Everything the updater must remember across a restart."""

    state: UpdateState = UpdateState.IDLE
    deployment: Deployment | None = None
    reason: str = ""
    save_count: int = Field(0, ge=0, description="state saves for this deployment (loop detection)")
    restarts: int = Field(0, ge=0, description="agent restarts seen while in probation")
    boot_counted: bool = Field(False, description="guard_boot already counted this start as a restart")
    download_path: Path | None = Field(
        None, description="the finished download, saved with the state after DOWNLOADING so a resume finds it"
    )
    staged_slot: str | None = None
    activated_slot: str | None = None
    probation_started: datetime | None = None
    updated: datetime | None = None


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new content, nothing else."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    # The rename itself lives in the directory: sync it too, or a power loss can undo it.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class StateFile:
    """Load and save the :class:`UpdateRecord` of one agent."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> UpdateRecord:
        """The saved record; IDLE when there is none. An unreadable file means we cannot know
        what was going on, so it is reported and treated as ROLLING_BACK (the safe default)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return UpdateRecord()
        try:
            return UpdateRecord.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as exc:
            log.error("update state file %s is unreadable (%s); rolling back to be safe", self.path, exc)
            return UpdateRecord(state=UpdateState.ROLLING_BACK, reason=f"state file unreadable: {exc}")

    def save(self, record: UpdateRecord) -> None:
        write_atomically(self.path, record.model_dump_json(indent=1).encode())
