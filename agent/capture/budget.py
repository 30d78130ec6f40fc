"""The capture directory's disk budget and retention: the oldest files go first.

File names start with the UTC time they were written (``writer.file_name``), so name order is
age order and no stat of every file is needed to find the oldest."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from edgesdk.capture.sealed import SUFFIX

log = logging.getLogger("edgesdk.agent.capture")


def capture_files(directory: Path) -> list[Path]:
    """Finished capture files, oldest first (temporary files of a write in progress start with a dot)."""
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIX) and not p.name.startswith("."))
    except FileNotFoundError:
        return []


def enforce(directory: Path, *, max_bytes: int, retention_s: float, now: float | None = None) -> int:
    """Delete files older than ``retention_s``, then the oldest until the rest fit ``max_bytes``;
    the number deleted."""
    now = time.time() if now is None else now
    files = capture_files(directory)
    sizes: list[tuple[Path, int]] = []
    deleted = 0
    for path in files:
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if now - stat.st_mtime > retention_s:
            deleted += _delete(path)
        else:
            sizes.append((path, stat.st_size))
    total = sum(size for _, size in sizes)
    for path, size in sizes:
        if total <= max_bytes:
            break
        deleted += _delete(path)
        total -= size
    return deleted


def _delete(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("capture: cannot delete %s: %s", path, exc)
        return 0
    return 1
