"""SHA-256 of a file, streamed: the one helper for every place that hashes a whole file
(image manifests, OTA downloads, the agent's slot check, benchmarks). ``hashlib.file_digest``
would do it, but it needs Python 3.11 and edgesdk supports 3.10."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """Hex SHA-256 of the file at ``path``, read in 1 MiB chunks (OSError if unreadable)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
