"""The ``.edgepkg`` container: fixed header, signed manifest, signature, payload area.

::

    offset  size  field
    0       8     magic  b"EDGEPKG\\0"
    8       2     container version (u16, big-endian) = 1
    10      2     flags (u16) = 0; anything else is refused
    12      4     manifest length M (u32), 1 .. MAX_MANIFEST_BYTES
    16      16    publisher key id (raw, = sha256(Ed25519 public key)[:16])
    32      8     payload area length P (u64), 0 .. MAX_PAYLOAD_AREA_BYTES
    40      8     reserved, zero
    48      M     manifest: UTF-8 JSON (BundleManifest)
    48+M    64    Ed25519 signature over SIGNATURE_CONTEXT || header(48) || manifest
    112+M   P     payload area: encrypted payloads at the offsets the manifest declares

The signature covers the header too, so version, lengths and key id cannot be changed
without breaking it. The file must be exactly ``112 + M + P`` bytes: a truncated file or
trailing data is refused before anything is hashed. Every length is checked against a
bound before anything of that size is allocated or read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

from edgesdk.errors import BundleFormatError
from edgesdk.schemas.manifest import BundleManifest

MAGIC = b"EDGEPKG\0"
CONTAINER_VERSION = 1
HEADER = struct.Struct(">8sHHI16sQ8s")
HEADER_SIZE = HEADER.size  # 48
SIGNATURE_SIZE = 64
SIGNATURE_CONTEXT = b"edgesdk bundle manifest v1\0"

#: A manifest of a few variants is a few KiB; a MiB leaves room for thousands of key slots.
MAX_MANIFEST_BYTES = 1024 * 1024
#: Payloads of one bundle together (the biggest edge models are a few GiB).
MAX_PAYLOAD_AREA_BYTES = 64 * 1024**3
#: One payload.
MAX_PAYLOAD_BYTES = 16 * 1024**3

AEAD_TAG_SIZE = 16


@dataclass(frozen=True)
class ContainerHeader:
    """The fixed 48-byte header, as read (not yet trusted: the signature covers it)."""

    version: int
    manifest_length: int
    publisher_key_id: bytes
    payload_area_length: int
    raw: bytes

    @property
    def manifest_offset(self) -> int:
        return HEADER_SIZE

    @property
    def payload_area_offset(self) -> int:
        return HEADER_SIZE + self.manifest_length + SIGNATURE_SIZE

    @property
    def file_size(self) -> int:
        return self.payload_area_offset + self.payload_area_length


def pack_header(*, manifest_length: int, publisher_key_id: bytes, payload_area_length: int) -> bytes:
    """The header bytes for a container being written."""
    if not 0 < manifest_length <= MAX_MANIFEST_BYTES:
        raise BundleFormatError(f"manifest of {manifest_length} bytes is outside 1..{MAX_MANIFEST_BYTES}")
    if not 0 <= payload_area_length <= MAX_PAYLOAD_AREA_BYTES:
        raise BundleFormatError(f"payloads of {payload_area_length} bytes exceed {MAX_PAYLOAD_AREA_BYTES}")
    return HEADER.pack(MAGIC, CONTAINER_VERSION, 0, manifest_length, publisher_key_id, payload_area_length, bytes(8))


def parse_header(raw: bytes, *, source: str) -> ContainerHeader:
    """Check and unpack the fixed header; BundleFormatError naming the bad field."""
    if len(raw) < HEADER_SIZE:
        if not MAGIC.startswith(raw[: len(MAGIC)]):
            raise BundleFormatError(f"{source}: not an edgesdk bundle (bad magic)")
        raise BundleFormatError(f"{source}: truncated: {len(raw)} bytes, the header alone is {HEADER_SIZE}")
    magic, version, flags, manifest_length, key_id, payload_length, reserved = HEADER.unpack(raw)
    if magic != MAGIC:
        raise BundleFormatError(f"{source}: not an edgesdk bundle (bad magic {magic!r})")
    if version != CONTAINER_VERSION:
        raise BundleFormatError(
            f"{source}: container version {version} is not supported (this edgesdk reads {CONTAINER_VERSION})"
        )
    if flags != 0 or reserved != bytes(8):
        raise BundleFormatError(f"{source}: unknown header flags {flags:#06x} / reserved bytes set")
    if not 0 < manifest_length <= MAX_MANIFEST_BYTES:
        raise BundleFormatError(f"{source}: manifest length {manifest_length} is outside 1..{MAX_MANIFEST_BYTES} bytes")
    if payload_length > MAX_PAYLOAD_AREA_BYTES:
        raise BundleFormatError(
            f"{source}: payload area of {payload_length} bytes exceeds the limit of {MAX_PAYLOAD_AREA_BYTES}"
        )
    return ContainerHeader(version, manifest_length, key_id, payload_length, raw)


def signed_message(header_raw: bytes, manifest_bytes: bytes) -> bytes:
    """What the publisher signs: a context string, the header and the manifest bytes."""
    return SIGNATURE_CONTEXT + header_raw + manifest_bytes


def read_exact(handle: BinaryIO, size: int, *, what: str, source: str) -> bytes:
    """Read exactly ``size`` bytes or fail as a truncated bundle."""
    data = handle.read(size)
    if len(data) != size:
        raise BundleFormatError(f"{source}: truncated while reading {what} ({len(data)} of {size} bytes)")
    return data


def ciphertext_length(plaintext_size: int, segment_size: int) -> int:
    """Bytes of a payload of ``plaintext_size`` after segmented AEAD (one tag per segment)."""
    return plaintext_size + AEAD_TAG_SIZE * segment_count(plaintext_size, segment_size)


def segment_count(plaintext_size: int, segment_size: int) -> int:
    """Segments of a payload: at least one (an empty payload is one empty final segment)."""
    return max(1, -(-plaintext_size // segment_size))


def check_layout(manifest: BundleManifest, header: ContainerHeader, *, source: str) -> None:
    """Cross-check the signed manifest against the container: every payload declared once, at
    an offset inside the payload area, without overlaps or gaps, and each ciphertext exactly
    as long as its declared plaintext size implies (a payload cannot be bigger than declared)."""
    encryption = manifest.encryption
    if encryption is None:
        raise BundleFormatError(f"{source}: manifest has no encryption section; not a bundle edgesdk can open")
    declared: dict[str, tuple[int, int]] = {v.payload: (v.size, v.encrypted_size) for v in manifest.variants}
    if manifest.golden is not None:
        declared[manifest.golden.payload] = (manifest.golden.size, manifest.golden.encrypted_size)
    locations = {loc.name: loc for loc in encryption.payloads}
    if len(locations) != len(encryption.payloads):
        raise BundleFormatError(f"{source}: payload table names a payload twice")
    if set(locations) != set(declared):
        missing = sorted(set(declared) - set(locations))
        extra = sorted(set(locations) - set(declared))
        raise BundleFormatError(
            f"{source}: payload table does not match the manifest (missing {missing}, extra {extra})"
        )
    position = 0
    for loc in sorted(encryption.payloads, key=lambda item: item.offset):
        size, encrypted_size = declared[loc.name]
        if size > MAX_PAYLOAD_BYTES:
            raise BundleFormatError(f"{source}: payload {loc.name!r} declares {size} bytes, over {MAX_PAYLOAD_BYTES}")
        if loc.offset != position:
            raise BundleFormatError(
                f"{source}: payload {loc.name!r} at offset {loc.offset}, expected {position} (gap or overlap)"
            )
        expected = ciphertext_length(size, encryption.segment_size)
        if loc.length != encrypted_size or encrypted_size != expected:
            raise BundleFormatError(
                f"{source}: payload {loc.name!r} is {loc.length} bytes in the container and {encrypted_size} in "
                f"the manifest, but {size} plaintext bytes encrypt to {expected}"
            )
        position += loc.length
    if position != header.payload_area_length:
        raise BundleFormatError(
            f"{source}: payloads cover {position} bytes but the payload area is {header.payload_area_length}"
        )
