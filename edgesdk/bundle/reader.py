"""Reading a container from disk in bounded pieces: the front (header, manifest, signature)
first, then payload bytes in chunks, never more than was declared and checked."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgesdk.bundle.container import (
    HEADER_SIZE,
    SIGNATURE_SIZE,
    ContainerHeader,
    parse_header,
    read_exact,
)
from edgesdk.errors import BundleFormatError

READ_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ContainerFront:
    """Everything before the payload area, read but not yet trusted."""

    header: ContainerHeader
    manifest_bytes: bytes
    signature: bytes
    actual_size: int


def open_bundle_file(path: Path | str) -> io.BufferedReader:
    """Open a bundle for reading; BundleFormatError if it is not a readable regular file."""
    path = Path(path)
    try:
        handle = open(path, "rb")  # noqa: SIM115 - the caller owns the handle
    except OSError as exc:
        raise BundleFormatError(f"cannot read bundle {path}: {exc.strerror or exc}") from exc
    if not os.path.isfile(path):
        handle.close()
        raise BundleFormatError(f"bundle {path} is not a regular file")
    return handle


def read_front(handle: io.BufferedReader, *, source: str) -> ContainerFront:
    """Read and bound-check the header, then the manifest and signature it announces.

    The file size is compared with what the header declares before the manifest is read,
    so a truncated file or one with data appended is refused at once."""
    actual_size = os.fstat(handle.fileno()).st_size
    header = parse_header(handle.read(HEADER_SIZE), source=source)
    if actual_size < header.file_size:
        raise BundleFormatError(f"{source}: truncated: {actual_size} bytes, the header declares {header.file_size}")
    if actual_size > header.file_size:
        raise BundleFormatError(
            f"{source}: {actual_size - header.file_size} unexpected bytes after the declared end of the bundle"
        )
    manifest_bytes = read_exact(handle, header.manifest_length, what="the manifest", source=source)
    signature = read_exact(handle, SIGNATURE_SIZE, what="the signature", source=source)
    return ContainerFront(header, manifest_bytes, signature, actual_size)


def iter_range(
    handle: io.BufferedReader, offset: int, length: int, *, source: str, chunk_size: int = READ_CHUNK
) -> Iterator[bytes]:
    """Yield exactly ``length`` bytes from ``offset`` in new chunks of at most ``chunk_size``.

    Each chunk is its own object, so it may be hashed on another thread while the next one
    is read. Reading stops at the declared length whatever the file holds beyond it."""
    handle.seek(offset)
    remaining = length
    while remaining:
        chunk = handle.read(min(remaining, chunk_size))
        if not chunk:
            raise BundleFormatError(f"{source}: truncated at byte {offset + length - remaining}")
        remaining -= len(chunk)
        yield chunk
