"""Segmented AES-256-GCM ("STREAM", as in age and Tink): encrypt and decrypt a payload in
fixed-size segments so neither side holds more than one segment of ciphertext at a time.

Each payload gets its own key, derived from the bundle's random content key::

    payload_key = HKDF-SHA256(ikm=content_key, salt=payload_salt, info=PAYLOAD_INFO || name)

so keys never repeat across payloads and a payload cannot be moved under another name.
Segment ``i`` (0-based) is sealed with the 12-byte nonce ``i as 11 bytes big-endian ||
final``, where ``final`` is 1 for the last segment and 0 otherwise. Because the position and
the final flag are authenticated, dropping, reordering, duplicating or truncating segments
fails decryption, and so does appending a segment after the final one. Every segment but the
last holds exactly ``segment_size`` plaintext bytes; an empty payload is one empty final
segment.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from edgesdk.bundle.container import AEAD_TAG_SIZE
from edgesdk.errors import IntegrityError

PAYLOAD_INFO = b"edgesdk bundle payload v1\0"
CONTENT_KEY_SIZE = 32
PAYLOAD_SALT_SIZE = 16
_COUNTER_BYTES = 11


def derive_payload_key(content_key: bytes, salt: bytes, name: str) -> bytes:
    """The AES-256 key of one payload."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=PAYLOAD_INFO + name.encode())
    return hkdf.derive(content_key)


def segment_nonce(index: int, final: bool) -> bytes:
    """Nonce of segment ``index``: an 11-byte counter and the final flag."""
    return index.to_bytes(_COUNTER_BYTES, "big") + (b"\x01" if final else b"\x00")


def encrypt_segments(payload_key: bytes, segments: Iterable[bytes]) -> Iterator[bytes]:
    """Seal plaintext segments (each ``segment_size`` bytes but the last) into ciphertext segments.

    The final flag needs to know which segment is last, so this looks one segment ahead."""
    aead = AESGCM(payload_key)
    iterator = iter(segments)
    current = next(iterator, b"")
    index = 0
    for following in iterator:
        yield aead.encrypt(segment_nonce(index, False), current, None)
        current = following
        index += 1
    yield aead.encrypt(segment_nonce(index, True), current, None)


class SegmentOpener:
    """Opens the segments of one payload in order, and says which one failed."""

    def __init__(self, payload_key: bytes, *, payload_name: str) -> None:
        self._aead = AESGCM(payload_key)
        self._name = payload_name

    def open_into(self, index: int, ciphertext: bytes | memoryview, final: bool, out: memoryview) -> int:
        """Decrypt segment ``index`` into ``out`` (exactly the plaintext length); returns it."""
        try:
            self._aead.decrypt_into(segment_nonce(index, final), ciphertext, None, out)
        except InvalidTag as exc:
            raise IntegrityError(
                f"payload {self._name!r}: segment {index} failed authentication (tampered, reordered or truncated)"
            ) from exc
        return len(ciphertext) - AEAD_TAG_SIZE

    def open(self, index: int, ciphertext: bytes | memoryview, final: bool) -> bytes:
        """Decrypt segment ``index`` into a new bytes object."""
        try:
            return self._aead.decrypt(segment_nonce(index, final), ciphertext, None)
        except InvalidTag as exc:
            raise IntegrityError(
                f"payload {self._name!r}: segment {index} failed authentication (tampered, reordered or truncated)"
            ) from exc
