"""The building blocks: segmented AEAD, key slots, the fixed header."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edgesdk.bundle.container import (
    HEADER,
    MAGIC,
    MAX_MANIFEST_BYTES,
    ciphertext_length,
    pack_header,
    parse_header,
)
from edgesdk.bundle.key_slots import new_content_key, unwrap_content_key, wrap_content_key
from edgesdk.bundle.stream_aead import SegmentOpener, derive_payload_key, encrypt_segments
from edgesdk.errors import BundleFormatError, DecryptionError, IntegrityError
from edgesdk.keys import key_id

SEGMENT = 4096
KEY = derive_payload_key(b"k" * 32, b"s" * 16, "model.enc")


def segments_of(data: bytes) -> list[bytes]:
    return [data[i : i + SEGMENT] for i in range(0, len(data), SEGMENT)] or [b""]


def open_all(sealed: list[bytes], key: bytes = KEY) -> bytes:
    opener = SegmentOpener(key, payload_name="model.enc")
    return b"".join(opener.open(i, c, final=i == len(sealed) - 1) for i, c in enumerate(sealed))


@pytest.mark.parametrize("size", [0, 1, SEGMENT - 1, SEGMENT, SEGMENT + 1, 3 * SEGMENT + 7])
def test_stream_round_trip_and_length(size: int) -> None:
    data = os.urandom(size)
    sealed = list(encrypt_segments(KEY, segments_of(data)))
    assert sum(len(s) for s in sealed) == ciphertext_length(size, SEGMENT)
    assert open_all(sealed) == data


def test_reordered_segments_fail() -> None:
    sealed = list(encrypt_segments(KEY, segments_of(os.urandom(3 * SEGMENT))))
    sealed[0], sealed[1] = sealed[1], sealed[0]
    with pytest.raises(IntegrityError, match="segment 0"):
        open_all(sealed)


def test_truncation_at_a_segment_boundary_fails() -> None:
    # Dropping the last segment leaves a stream whose new last segment was not sealed as final.
    sealed = list(encrypt_segments(KEY, segments_of(os.urandom(3 * SEGMENT))))
    with pytest.raises(IntegrityError, match="segment 1"):
        open_all(sealed[:2])


def test_payload_key_depends_on_name_and_salt() -> None:
    sealed = list(encrypt_segments(KEY, [b"x" * 10]))
    with pytest.raises(IntegrityError):
        open_all(sealed, derive_payload_key(b"k" * 32, b"s" * 16, "other.enc"))
    with pytest.raises(IntegrityError):
        open_all(sealed, derive_payload_key(b"k" * 32, b"t" * 16, "model.enc"))


def test_key_slot_opens_only_for_its_recipient() -> None:
    alice, bob, eve = (X25519PrivateKey.generate() for _ in range(3))
    content = new_content_key()
    slots = [wrap_content_key(content, alice.public_key()), wrap_content_key(content, bob.public_key(), kind="group")]
    assert unwrap_content_key(slots, alice) == content
    assert unwrap_content_key(slots, bob) == content
    with pytest.raises(DecryptionError, match=f"not encrypted for device key {key_id(eve.public_key())}"):
        unwrap_content_key(slots, eve)


def test_key_slot_bound_to_recipient() -> None:
    # A slot relabelled with another recipient's id does not open for that recipient.
    alice, eve = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    slot = wrap_content_key(new_content_key(), alice.public_key())
    forged = slot.model_copy(update={"recipient": key_id(eve.public_key())})
    with pytest.raises(DecryptionError, match="does not open"):
        unwrap_content_key([forged], eve)


def test_header_round_trip() -> None:
    raw = pack_header(manifest_length=100, publisher_key_id=b"i" * 16, payload_area_length=5)
    header = parse_header(raw, source="b")
    assert (header.manifest_length, header.payload_area_length, header.file_size) == (100, 5, 48 + 100 + 64 + 5)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"magic": b"PK\x03\x04\0\0\0\0"}, "not an edgesdk bundle"),
        ({"version": 2}, "container version 2 is not supported"),
        ({"flags": 1}, "unknown header flags"),
        ({"manifest_length": 0}, "manifest length 0"),
        ({"manifest_length": 0xFFFFFFFF}, f"manifest length {0xFFFFFFFF} is outside 1..{MAX_MANIFEST_BYTES}"),
        ({"payload_length": 2**63}, "payload area of"),
    ],
)
def test_bad_headers_are_refused_before_allocating(fields: dict, needle: str) -> None:
    values = {"magic": MAGIC, "version": 1, "flags": 0, "manifest_length": 10, "payload_length": 0} | fields
    raw = HEADER.pack(
        values["magic"],
        values["version"],
        values["flags"],
        values["manifest_length"],
        b"i" * 16,
        values["payload_length"],
        bytes(8),
    )
    with pytest.raises(BundleFormatError, match=needle):
        parse_header(raw, source="b")


def test_short_header_is_truncated() -> None:
    with pytest.raises(BundleFormatError, match="truncated"):
        parse_header(MAGIC + b"\0\1", source="b")
