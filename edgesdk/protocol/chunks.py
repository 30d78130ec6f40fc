"""Wire format of bundle chunks over MQTT: raw bytes behind a small JSON header.

Both sides speak it: the fleet's chunk server encodes frames on ``topics.OTA_CHUNK_DATA``, the
device's downloader decodes them.

A frame is ``MAGIC`` + big-endian u16 header length + ChunkHeader JSON + chunk bytes. No
base64: bytes on the wire stay within ~150 bytes per chunk of the bundle size. The chunk hashes
come from the signed Deployment, never from the frame, so a frame cannot vouch for itself.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from pathlib import Path

from edgesdk.errors import SchemaError
from edgesdk.schemas.messages import ChunkHeader

MAGIC = b"EOC1"
_LENGTH = struct.Struct(">H")
DEFAULT_CHUNK_SIZE = 256 * 1024


def encode_frame(header: ChunkHeader, data: bytes = b"") -> bytes:
    """One chunk frame: magic, header length, header JSON, raw data."""
    head = header.model_dump_json(exclude_none=True).encode()
    return MAGIC + _LENGTH.pack(len(head)) + head + data


def decode_frame(frame: bytes) -> tuple[ChunkHeader, memoryview]:
    """Split a frame; SchemaError on anything that is not one (the caller drops it)."""
    if len(frame) < len(MAGIC) + _LENGTH.size or not frame.startswith(MAGIC):
        raise SchemaError("chunk frame: bad magic (not an edgesdk chunk frame)")
    (head_len,) = _LENGTH.unpack_from(frame, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    if start + head_len > len(frame):
        raise SchemaError(f"chunk frame: header length {head_len} runs past the frame ({len(frame)} bytes)")
    header = ChunkHeader.parse_json_clear(frame[start : start + head_len], source="chunk frame header")
    return header, memoryview(frame)[start + head_len :]


def chunk_count(size: int, chunk_size: int) -> int:
    return max(1, -(-size // chunk_size))


def chunk_hashes(path: Path, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[str]:
    """sha256 of every ``chunk_size`` piece of ``path`` (what the operator signs into a Deployment)."""
    return [hashlib.sha256(piece).hexdigest() for piece in iter_chunks(path, chunk_size)]


def iter_chunks(path: Path, chunk_size: int) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while piece := handle.read(chunk_size):
            yield piece
