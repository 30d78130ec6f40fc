"""Wrapping the bundle's content key for each recipient (HPKE-like, base mode).

For every recipient public key R the packager makes a one-time X25519 key pair (e, E) and::

    shared   = X25519(e, R)
    wrap_key = HKDF-SHA256(ikm=shared, salt=E || R, info=WRAP_INFO)
    slot     = E, AES-256-GCM(wrap_key, nonce=0^12, content_key, aad=key_id(R))

The all-zero nonce is safe because every wrap key is used exactly once (fresh ``e`` per
slot). The device finds its slot by key id and recomputes ``shared = X25519(r, E)``.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from edgesdk.errors import DecryptionError
from edgesdk.keys import key_id, key_id_bytes
from edgesdk.schemas.manifest import KeySlot

WRAP_INFO = b"edgesdk bundle key-wrap v1\0"
_ZERO_NONCE = bytes(12)


def _raw(public_key: X25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _wrap_key(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=ephemeral + recipient, info=WRAP_INFO)
    return hkdf.derive(shared)


def wrap_content_key(content_key: bytes, recipient: X25519PublicKey, *, kind: str = "device") -> KeySlot:
    """A key slot that only the holder of ``recipient``'s private key can open."""
    ephemeral = X25519PrivateKey.generate()
    ephemeral_raw = _raw(ephemeral.public_key())
    wrap_key = _wrap_key(ephemeral.exchange(recipient), ephemeral_raw, _raw(recipient))
    wrapped = AESGCM(wrap_key).encrypt(_ZERO_NONCE, content_key, key_id_bytes(recipient))
    return KeySlot(
        recipient=key_id(recipient), kind=kind, ephemeral_public=ephemeral_raw.hex(), wrapped_key=wrapped.hex()
    )  # type: ignore[arg-type]


def unwrap_content_key(slots: list[KeySlot], device_key: X25519PrivateKey) -> bytes:
    """The content key from the slot addressed to ``device_key``; DecryptionError if none opens."""
    public = device_key.public_key()
    my_id = key_id(public)
    mine = [slot for slot in slots if slot.recipient == my_id]
    if not mine:
        recipients = ", ".join(sorted({slot.recipient for slot in slots}))
        raise DecryptionError(f"bundle is not encrypted for device key {my_id}; it is for: {recipients}")
    for slot in mine:
        ephemeral_raw = bytes.fromhex(slot.ephemeral_public)
        try:
            shared = device_key.exchange(X25519PublicKey.from_public_bytes(ephemeral_raw))
            wrap_key = _wrap_key(shared, ephemeral_raw, _raw(public))
            return AESGCM(wrap_key).decrypt(_ZERO_NONCE, bytes.fromhex(slot.wrapped_key), key_id_bytes(public))
        except (InvalidTag, ValueError):
            continue  # a corrupt slot; another one for the same key may still open
    raise DecryptionError(f"the key slot for device key {my_id} does not open (corrupt slot or wrong key)")


def new_content_key() -> bytes:
    """A fresh random 256-bit content key (one per bundle)."""
    return os.urandom(32)
