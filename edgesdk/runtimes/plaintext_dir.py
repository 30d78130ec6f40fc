"""Where a runtime that can only load from a directory may put a decrypted model: memory only.

Every other runtime loads from bytes. Core ML compiles from a package *directory*, so its
plaintext has to be a file for a moment. It must not be a file on a persistent file system: a
power cut between writing and removing it, or a copy of the SD card, would leak the model the
bundle encrypted. So the directory must be on ``tmpfs``/``ramfs`` (checked against the mount
table, not trusted from its name): a configured ``plaintext_dir`` runtime option, else
``$XDG_RUNTIME_DIR``, else ``/dev/shm``. When none is memory-backed the load is refused, unless
the operator opts in with the runtime option ``allow_persistent_plaintext = "true"`` (a macOS
device without a RAM disk: the risk is then theirs, and it is logged).
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from edgesdk.errors import BackendUnavailableError

log = logging.getLogger("edgesdk.runtimes.plaintext_dir")

#: File system types whose files live in RAM only.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def _unescape(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal (\040 ...).
    return field.encode().decode("unicode_escape") if "\\" in field else field


def parse_mounts(text: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of each line of /proc/mounts or of BSD/macOS ``mount``."""
    mounts: list[tuple[str, str]] = []
    for line in text.splitlines():
        if " on " in line and line.rstrip().endswith(")"):  # "dev on /point (type, flags)"
            rest = line.split(" on ", 1)[1]
            point, _, kinds = rest.rpartition(" (")
            mounts.append((point, kinds.split(",")[0].strip()))
            continue
        fields = line.split()
        if len(fields) >= 3:
            mounts.append((_unescape(fields[1]), fields[2]))
    return mounts


def read_mounts() -> list[tuple[str, str]]:
    """This machine's mount table (empty when it cannot be read)."""
    try:
        return parse_mounts(Path("/proc/self/mounts").read_text())
    except OSError:
        pass
    try:
        listing = subprocess.run(["mount"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_mounts(listing)


def filesystem_type(path: Path, mounts: Sequence[tuple[str, str]]) -> str | None:
    """The type of the file system ``path`` is on: that of the longest mount point above it."""
    resolved = str(Path(path).resolve())
    best: tuple[int, str] | None = None
    for point, kind in mounts:
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > best[0]):
            best = (len(point), kind)
    return best[1] if best else None


def candidate_dirs(options: Mapping[str, str], environ: Mapping[str, str]) -> list[Path]:
    """The directories tried, in order: the configured one, $XDG_RUNTIME_DIR, /dev/shm."""
    configured = options.get("plaintext_dir")
    if configured:
        return [Path(configured)]  # configured: that one or none, never a silent other place
    found = [Path(environ["XDG_RUNTIME_DIR"])] if environ.get("XDG_RUNTIME_DIR") else []
    return [*found, Path("/dev/shm")]


def choose_plaintext_dir(
    options: Mapping[str, str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    mounts: Sequence[tuple[str, str]] | None = None,
) -> Path:
    """A writable memory-backed directory for a decrypted model; BackendUnavailableError with
    every candidate and its file system when there is none (and no explicit opt-in)."""
    options = dict(options or {})
    environ = os.environ if environ is None else environ
    mounts = read_mounts() if mounts is None else mounts
    tried: list[str] = []
    for directory in candidate_dirs(options, environ):
        kind = filesystem_type(directory, mounts) if directory.is_dir() else None
        if kind in MEMORY_FILESYSTEMS and os.access(directory, os.W_OK | os.X_OK):
            return directory
        tried.append(f"{directory} ({'missing' if not directory.is_dir() else kind or 'unknown file system'})")
    if options.get("allow_persistent_plaintext", "").lower() == "true":
        fallback = Path(tempfile.gettempdir())
        log.warning(
            "no memory-backed directory (%s): the decrypted model is written to %s for a moment "
            "(allow_persistent_plaintext = true)",
            ", ".join(tried),
            fallback,
        )
        return fallback
    raise BackendUnavailableError(
        f"no memory-backed (tmpfs/ramfs) directory for the decrypted model on {platform.system()}: tried "
        + ", ".join(tried)
        + "; set the runtime option plaintext_dir to one (e.g. a RAM disk), or allow_persistent_plaintext = true "
        "to accept the plaintext on disk"
    )
