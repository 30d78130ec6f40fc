"""Sealing bytes to an operator's X25519 key, the way bundles are sealed to devices.

A fresh 256-bit content key encrypts the record (AES-256-GCM, random nonce); the content key is
wrapped for the operator's public key exactly as a bundle's is for a device
(:mod:`edgesdk.bundle.key_slots`: one-time X25519 + HKDF-SHA256 + AES-GCM). The file::

    MAGIC (8 bytes) | header length (4, big-endian) | header JSON | ciphertext + GCM tag

The header holds only the key slot and the nonce (no model name, no sizes beyond the file's),
and it is the ciphertext's associated data: a changed header fails the tag like a changed byte
of ciphertext does.
"""

from __future__ import annotations

import json
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from edgesdk.bundle.key_slots import new_content_key, unwrap_content_key, wrap_content_key
from edgesdk.errors import DecryptionError, EdgeSDKError
from edgesdk.keys import key_id
from edgesdk.schemas.manifest import KeySlot

MAGIC = b"EDGECAP1"
#: File names the agent gives capture files.
SUFFIX = ".edgecap"
#: A header is a key slot and a nonce: a few hundred bytes; more is not a capture file.
MAX_HEADER_BYTES = 4096
_LENGTH = struct.Struct(">I")


class CaptureFileError(EdgeSDKError):
    """A capture file is not one, was changed, or is not encrypted to this operator key."""


def seal(plaintext: bytes, operator: X25519PublicKey) -> bytes:
    """``plaintext`` encrypted so that only ``operator``'s private key opens it."""
    content_key = new_content_key()
    nonce = os.urandom(12)
    slot = wrap_content_key(content_key, operator)  # a bundle's slot; the operator key is its recipient
    header = json.dumps({"slot": slot.model_dump(mode="json"), "nonce": nonce.hex()}, sort_keys=True).encode()
    front = MAGIC + _LENGTH.pack(len(header)) + header
    return front + AESGCM(content_key).encrypt(nonce, plaintext, front)


def recipient(data: bytes, *, source: str) -> str:
    """The key id a sealed file is encrypted to (readable without any key)."""
    return _parse(data, source)[1].recipient


def open_sealed(data: bytes, operator: X25519PrivateKey, *, source: str) -> bytes:
    """The plaintext of a sealed file; CaptureFileError (one line) for a wrong key or a changed byte."""
    front_len, slot, nonce = _parse(data, source)
    mine = key_id(operator.public_key())
    if slot.recipient != mine:
        raise CaptureFileError(
            f"{source} is encrypted to operator key {slot.recipient}, not to this key ({mine}): "
            "pass the private key whose public half the agent's [capture] operator_public_key names"
        )
    try:
        content_key = unwrap_content_key([slot], operator)
        return AESGCM(content_key).decrypt(nonce, data[front_len:], data[:front_len])
    except (DecryptionError, InvalidTag) as exc:
        raise CaptureFileError(f"{source} does not decrypt: it was changed or truncated after it was written") from exc


def _parse(data: bytes, source: str) -> tuple[int, KeySlot, bytes]:
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LENGTH.size:
        raise CaptureFileError(f"{source} is not a capture file (it does not start with {MAGIC!r})")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    if length > MAX_HEADER_BYTES or start + length > len(data):
        raise CaptureFileError(f"{source}: capture header of {length} bytes is truncated or over {MAX_HEADER_BYTES}")
    try:
        header = json.loads(data[start : start + length])
        slot = KeySlot.model_validate(header["slot"])
        nonce = bytes.fromhex(header["nonce"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CaptureFileError(f"{source}: capture header is malformed ({exc})") from exc
    if len(nonce) != 12:
        raise CaptureFileError(f"{source}: capture nonce is {len(nonce)} bytes, not 12")
    return start + length, slot, nonce
