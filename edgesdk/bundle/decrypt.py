"""Decrypting a verified bundle's payloads in memory: the plaintext never touches disk.

Only a :class:`VerifiedBundle` is accepted. Payloads are read segment by segment and
decrypted straight into the ``bytes`` objects handed to the runtimes, each allocated at its
signed size (so a payload can never grow past what the manifest says); every segment's GCM
tag and the payload's signed SHA-256 are checked before any byte is handed out.

:func:`decrypt_and_load` is the same with one difference in timing, for the agent's start:
the signed SHA-256 of the plaintext is computed on a second thread WHILE the caller's loader
builds its runtime session from the (already GCM-authenticated) bytes, and the session is
returned only if the hash matches — nothing runs on a model before it is proven. On two or
more cores the hash then costs no wall time, which is what brings "verify + decrypt +
create session" within a few percent of creating the session from a plaintext file.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edgesdk.bundle.background_hash import BackgroundHasher
from edgesdk.bundle.bytes_buffer import BytesBuilder
from edgesdk.bundle.container import AEAD_TAG_SIZE, segment_count
from edgesdk.bundle.key_slots import unwrap_content_key
from edgesdk.bundle.reader import open_bundle_file
from edgesdk.bundle.stream_aead import SegmentOpener, derive_payload_key
from edgesdk.bundle.verify import VerifiedBundle
from edgesdk.errors import BundleFormatError, DecryptionError, IntegrityError, UsageError
from edgesdk.schemas.manifest import BundleEncryption, Variant

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")

#: Below this many plaintext bytes the hash runs inline: a thread would cost more than it hides.
CONCURRENT_HASH_MIN_BYTES = 1 << 20
#: From this many plaintext bytes on, decrypt_and_load decrypts on two threads.
PARALLEL_DECRYPT_MIN_BYTES = 4 << 20


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


def _decrypt_parts(
    bundle: VerifiedBundle,
    payload_name: str,
    sizes: list[int],
    device_key: X25519PrivateKey,
    *,
    check_plaintext: bool = True,
) -> tuple[list[bytes], str]:
    """Decrypt one payload straight into one ``bytes`` object per part (a variant's files);
    returns the parts and the payload's signed plaintext SHA-256.

    Each segment is decrypted into the part it belongs to; the rare segment that spans two
    parts goes through a scratch buffer. Every segment's GCM tag is checked. With
    ``check_plaintext`` the signed SHA-256 is also checked over the plaintext in order
    before any part is returned (hashed on a second thread while the next segment is
    decrypted). Without it the caller checks the hash (decrypt_and_load), so the segments of
    a big payload are decrypted on two threads instead, half each."""
    bundle = _require_verified(bundle)
    encryption = _encryption(bundle)
    location = next((p for p in encryption.payloads if p.name == payload_name), None)
    if location is None:
        raise UsageError(f"bundle has no payload {payload_name!r}")
    size, expected_sha = _declared(bundle, payload_name)
    source = str(bundle.path)
    if sum(sizes) != size:
        raise BundleFormatError(f"{source}: payload {payload_name!r}: files add up to {sum(sizes)}, not {size} bytes")
    content_key = unwrap_content_key(encryption.key_slots, _require_device_key(device_key))
    payload_key = derive_payload_key(content_key, bytes.fromhex(location.salt), payload_name)
    segments = _Segments(
        bundle, bundle.payload_area_offset + location.offset, payload_name, encryption.segment_size, size, sizes
    )
    if check_plaintext:
        with BackgroundHasher(hashlib.sha256(), expected_bytes=size) as digest:
            segments.decrypt(payload_key, 0, segments.count, digest.update)
            if digest.hexdigest() != expected_sha:
                raise _plaintext_mismatch(source, payload_name)
    elif size >= PARALLEL_DECRYPT_MIN_BYTES and segments.count >= 2:
        # AES-GCM releases the GIL: the first half on a second thread, the second half here.
        half = segments.count // 2
        with ThreadPoolExecutor(1, thread_name_prefix="edgesdk-decrypt") as pool:
            first_half = pool.submit(segments.decrypt, payload_key, 0, half, None)
            try:
                segments.decrypt(payload_key, half, segments.count, None)
            finally:
                first_half.result()  # its IntegrityError, if any, is raised here
    else:
        segments.decrypt(payload_key, 0, segments.count, None)
    return segments.finish(), expected_sha


class _Segments:
    """The segments of one payload and the parts (files) their plaintext goes to."""

    def __init__(
        self, bundle: VerifiedBundle, offset: int, payload_name: str, segment_size: int, size: int, sizes: list[int]
    ) -> None:
        self.bundle = bundle
        self.offset = offset
        self.payload_name = payload_name
        self.segment_size = segment_size
        self.size = size
        self.count = segment_count(size, segment_size)
        self.parts = [BytesBuilder(part) for part in sizes]
        self.starts = [sum(sizes[:i]) for i in range(len(sizes))]

    def decrypt(
        self, payload_key: bytes, first: int, stop: int, hash_update: Callable[[memoryview], None] | None
    ) -> None:
        """Decrypt segments ``first`` … ``stop - 1`` into the parts (feeding ``hash_update`` the
        plaintext in order, when given). Own file handle and buffers: safe beside another call
        on a disjoint range."""
        source = str(self.bundle.path)
        opener = SegmentOpener(payload_key, payload_name=self.payload_name)
        segment_size = self.segment_size
        cipher_view = memoryview(bytearray(segment_size + AEAD_TAG_SIZE))
        scratch: memoryview | None = None
        with open_bundle_file(self.bundle.path) as handle:
            # Every segment but the last holds exactly segment_size plaintext bytes + its tag.
            handle.seek(self.offset + first * (segment_size + AEAD_TAG_SIZE))
            position = first * segment_size
            for index in range(first, stop):
                plain_length = min(segment_size, self.size - position)
                wanted = plain_length + AEAD_TAG_SIZE
                if handle.readinto(cipher_view[:wanted]) != wanted:
                    raise BundleFormatError(
                        f"{source}: truncated in payload {self.payload_name!r} (changed since it was verified?)"
                    )
                final = index == self.count - 1
                targets = _targets(self.parts, self.starts, position, plain_length)
                if plain_length == 0:
                    opener.open(index, cipher_view[:wanted], final)
                elif len(targets) == 1:
                    opener.open_into(index, cipher_view[:wanted], final, targets[0])
                    if hash_update is not None:
                        hash_update(targets[0])  # hashed on the worker while the next segment is decrypted
                else:
                    scratch = scratch if scratch is not None else memoryview(bytearray(segment_size))
                    segment = scratch[:plain_length]
                    opener.open_into(index, cipher_view[:wanted], final, segment)
                    offset = 0
                    for target in targets:
                        target[:] = segment[offset : offset + len(target)]
                        if hash_update is not None:
                            hash_update(target)  # the copies, so the scratch buffer is free again at once
                        offset += len(target)
                position += plain_length

    def finish(self) -> list[bytes]:
        return [part.finish() for part in self.parts]


def _plaintext_mismatch(source: str, payload_name: str) -> IntegrityError:
    return IntegrityError(f"{source}: payload {payload_name!r} plaintext does not match its signed SHA-256")


class _PlaintextHash:
    """SHA-256 of a payload's parts in order, on a second thread for big payloads.

    The thread is started and has entered hashlib (which releases the GIL for the whole
    update) before the constructor returns, so that it runs even while the caller sits in a
    runtime's C++ code that holds the GIL (onnxruntime creates sessions that way): started
    any later, it would wait for the GIL until the session was built."""

    def __init__(self, parts: list[bytes]) -> None:
        self._digest = hashlib.sha256()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if sum(len(p) for p in parts) < CONCURRENT_HASH_MIN_BYTES:
            for part in parts:
                self._digest.update(part)
            return
        entered = threading.Event()
        biggest = max(range(len(parts)), key=lambda i: len(parts[i]))

        def work() -> None:
            try:
                for index, part in enumerate(parts):
                    if index == biggest:
                        entered.set()  # the next call releases the GIL for as long as it hashes
                    self._digest.update(part)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller in hexdigest()
                self._error = exc
            finally:
                entered.set()

        self._thread = threading.Thread(target=work, name="edgesdk-plaintext-hash", daemon=True)
        self._thread.start()
        entered.wait()

    def hexdigest(self) -> str:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._digest.hexdigest()


def _targets(parts: list[BytesBuilder], starts: list[int], position: int, length: int) -> list[memoryview]:
    """The slices of the parts that plaintext bytes [position, position + length) go to."""
    end = position + length
    slices = []
    for part, start in zip(parts, starts, strict=True):
        lo, hi = max(position, start), min(end, start + part.size)
        if lo < hi:
            slices.append(part.view[lo - start : hi - start])
    return slices


def decrypt_variant(bundle: VerifiedBundle, variant_id: str, device_key: X25519PrivateKey) -> dict[str, bytes]:
    """The files of one variant (file name → plaintext bytes), in memory only.

    File names are as the runtime loaders expect them ("model.onnx", "model.xml" +
    "model.bin", …). Every segment's tag and the payload's signed SHA-256 are checked (the
    payload is the files in order, and their signed sizes fix where each one starts); a
    mismatch raises IntegrityError."""
    bundle = _require_verified(bundle)
    variant = _variant(bundle, variant_id)
    contents, _ = _decrypt_parts(bundle, variant.payload, [f.size for f in variant.files], device_key)
    # bytes (immutable) is what the runtimes want: LiteRT keeps a reference to it.
    return {entry.name: content for entry, content in zip(variant.files, contents, strict=True)}


def decrypt_and_load(
    bundle: VerifiedBundle, variant_id: str, device_key: X25519PrivateKey, load: Callable[[dict[str, bytes]], T]
) -> T:
    """Decrypt a variant in memory and return ``load(files)``, only once its plaintext is proven.

    Every segment's GCM tag is checked while decrypting; then ``load`` (e.g. creating a
    runtime session) runs while the plaintext's signed SHA-256 is computed on a second
    thread. If the hash does not match, whatever ``load`` returned is closed (when it has a
    ``close``) and IntegrityError is raised — also when ``load`` itself failed, since a
    corrupted model is the likelier cause then. ``files`` is as from :func:`decrypt_variant`."""
    bundle = _require_verified(bundle)
    variant = _variant(bundle, variant_id)
    contents, expected_sha = _decrypt_parts(
        bundle, variant.payload, [f.size for f in variant.files], device_key, check_plaintext=False
    )
    files = {entry.name: content for entry, content in zip(variant.files, contents, strict=True)}
    check = _PlaintextHash(contents)
    del contents
    try:
        result = load(files)
    except BaseException as exc:
        if check.hexdigest() != expected_sha:
            raise _plaintext_mismatch(str(bundle.path), variant.payload) from exc
        raise
    if check.hexdigest() != expected_sha:
        close = getattr(result, "close", None)
        if callable(close):
            close()
        raise _plaintext_mismatch(str(bundle.path), variant.payload)
    return result


def _variant(bundle: VerifiedBundle, variant_id: str) -> Variant:
    try:
        variant = bundle.manifest.variant(variant_id)
    except KeyError:
        known = ", ".join(v.id for v in bundle.manifest.variants)
        raise UsageError(f"bundle has no variant {variant_id!r}; it has: {known}") from None
    if not variant.files:
        raise BundleFormatError(f"{bundle.path}: variant {variant_id!r} lists no files")
    return variant


def decrypt_golden(bundle: VerifiedBundle, device_key: X25519PrivateKey) -> dict[str, np.ndarray] | None:
    """The golden inputs/outputs of the on-device smoke test, or None if the bundle has none."""
    bundle = _require_verified(bundle)
    golden = bundle.manifest.golden
    if golden is None:
        return None
    import numpy as np  # here: the agent's unseal helper decrypts variants only, and starts faster without it

    plaintext = _decrypt_parts(bundle, golden.payload, [golden.size], device_key)[0][0]
    try:
        with np.load(io.BytesIO(plaintext), allow_pickle=False) as archive:
            arrays: dict[str, Any] = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, EOFError) as exc:
        raise BundleFormatError(f"{bundle.path}: golden payload is not a readable .npz ({exc})") from exc
    return arrays
