"""Decrypting a verified bundle's payloads in memory: the plaintext never touches disk.

Only a :class:`VerifiedBundle` is accepted. Payloads are read segment by segment and
decrypted straight into one buffer of the declared plaintext size (so a payload can never
grow past what the signed manifest says); each segment's GCM tag, the payload's SHA-256
and every file's SHA-256 are checked before any byte is handed out.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edgesdk.bundle.background_hash import BackgroundHasher
from edgesdk.bundle.container import AEAD_TAG_SIZE, segment_count
from edgesdk.bundle.key_slots import unwrap_content_key
from edgesdk.bundle.reader import open_bundle_file
from edgesdk.bundle.stream_aead import SegmentOpener, derive_payload_key
from edgesdk.bundle.verify import VerifiedBundle
from edgesdk.errors import BundleFormatError, DecryptionError, IntegrityError, UsageError
from edgesdk.schemas.manifest import BundleEncryption


def _require_verified(bundle: object) -> VerifiedBundle:
    if not isinstance(bundle, VerifiedBundle):
        raise TypeError(f"expected a VerifiedBundle from verify_bundle(), got {type(bundle).__name__}")
    return bundle


def _require_device_key(device_key: object) -> X25519PrivateKey:
    if not isinstance(device_key, X25519PrivateKey):
        raise DecryptionError(
            f"a device key is an X25519 private key (edgesdk.keys.load_device_private_key), got {type(device_key).__name__}"
        )
    return device_key


def _encryption(bundle: VerifiedBundle) -> BundleEncryption:
    encryption = bundle.manifest.encryption
    if encryption is None:  # verify_bundle refuses such a manifest; this keeps the types honest
        raise BundleFormatError(f"{bundle.path}: manifest has no encryption section")
    return encryption


def _declared(bundle: VerifiedBundle, payload_name: str) -> tuple[int, str]:
    for variant in bundle.manifest.variants:
        if variant.payload == payload_name:
            return variant.size, variant.sha256
    golden = bundle.manifest.golden
    if golden is not None and golden.payload == payload_name:
        return golden.size, golden.sha256
    raise UsageError(f"bundle has no payload {payload_name!r}")


def decrypt_payload(bundle: VerifiedBundle, payload_name: str, device_key: X25519PrivateKey) -> bytearray:
    """One payload's plaintext, decrypted into a buffer of exactly its declared size."""
    bundle = _require_verified(bundle)
    encryption = _encryption(bundle)
    location = next((p for p in encryption.payloads if p.name == payload_name), None)
    if location is None:
        raise UsageError(f"bundle has no payload {payload_name!r}")
    size, expected_sha = _declared(bundle, payload_name)
    content_key = unwrap_content_key(encryption.key_slots, _require_device_key(device_key))
    opener = SegmentOpener(
        derive_payload_key(content_key, bytes.fromhex(location.salt), payload_name), payload_name=payload_name
    )
    source = str(bundle.path)
    segment_size = encryption.segment_size
    count = segment_count(size, segment_size)
    plaintext = bytearray(size)
    out = memoryview(plaintext)
    ciphertext = bytearray(segment_size + AEAD_TAG_SIZE)
    cipher_view = memoryview(ciphertext)
    with open_bundle_file(bundle.path) as handle, BackgroundHasher(hashlib.sha256(), expected_bytes=size) as digest:
        handle.seek(bundle.payload_area_offset + location.offset)
        position = 0
        for index in range(count):
            plain_length = min(segment_size, size - position)
            wanted = plain_length + AEAD_TAG_SIZE
            got = handle.readinto(cipher_view[:wanted])
            if got != wanted:
                raise BundleFormatError(
                    f"{source}: truncated in payload {payload_name!r} (changed since it was verified?)"
                )
            segment = out[position : position + plain_length]
            opener.open_into(index, cipher_view[:wanted], index == count - 1, segment)
            digest.update(segment)  # hashed on the worker while the next segment is read and decrypted
            position += plain_length
        if digest.hexdigest() != expected_sha:
            raise IntegrityError(f"{source}: payload {payload_name!r} plaintext does not match its signed SHA-256")
    return plaintext


def decrypt_variant(bundle: VerifiedBundle, variant_id: str, device_key: X25519PrivateKey) -> dict[str, bytes]:
    """The files of one variant (file name → plaintext bytes), in memory only.

    File names are as the runtime loaders expect them ("model.onnx", "model.xml" +
    "model.bin", …). Every segment's tag and the payload's signed SHA-256 are checked; a
    mismatch raises IntegrityError."""
    bundle = _require_verified(bundle)
    try:
        variant = bundle.manifest.variant(variant_id)
    except KeyError:
        known = ", ".join(v.id for v in bundle.manifest.variants)
        raise UsageError(f"bundle has no variant {variant_id!r}; it has: {known}") from None
    if not variant.files:
        raise BundleFormatError(f"{bundle.path}: variant {variant_id!r} lists no files")
    plaintext = decrypt_payload(bundle, variant.payload, device_key)
    view = memoryview(plaintext)
    files: dict[str, bytes] = {}
    position = 0
    try:
        # The payload's SHA-256 (checked above) covers the concatenation, and the signed file
        # sizes fix where each file starts, so every file's bytes are already authenticated.
        for entry in variant.files:
            # bytes (immutable) is what the runtimes want: LiteRT keeps a reference to it.
            files[entry.name] = bytes(view[position : position + entry.size])
            position += entry.size
    finally:
        view.release()
        del plaintext  # drop the working copy now rather than when the caller's frame ends
    return files


def decrypt_golden(bundle: VerifiedBundle, device_key: X25519PrivateKey) -> dict[str, np.ndarray] | None:
    """The golden inputs/outputs of the on-device smoke test, or None if the bundle has none."""
    bundle = _require_verified(bundle)
    golden = bundle.manifest.golden
    if golden is None:
        return None
    plaintext = decrypt_payload(bundle, golden.payload, device_key)
    try:
        with np.load(io.BytesIO(plaintext), allow_pickle=False) as archive:
            arrays: dict[str, Any] = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, EOFError) as exc:
        raise BundleFormatError(f"{bundle.path}: golden payload is not a readable .npz ({exc})") from exc
    return arrays
