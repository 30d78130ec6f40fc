"""Crash-safe file writes: write a temporary file beside the target, fsync, rename, fsync
the directory. A power cut leaves either the old file or the new one, never half of each."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, chunks: Iterable[bytes] | bytes, mode: int = 0o600) -> None:
    """Write ``chunks`` to ``path`` atomically with permissions ``mode``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path, data: Any, mode: int = 0o600) -> None:
    """``atomic_write_bytes`` of pretty JSON."""
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), mode)
