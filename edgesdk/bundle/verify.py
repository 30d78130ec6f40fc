"""``verify_bundle()``: the only way to get a :class:`VerifiedBundle`.

Order of checks, cheapest and most fundamental first, so that nothing is parsed or hashed
before it is known to come from a trusted publisher:

1. container header and exact file size (truncation, appended data, absurd lengths);
2. publisher key id in the header is one of ``trusted_publishers``;
3. Ed25519 signature over header + manifest bytes (nothing is parsed before this);
4. manifest schema, publisher key id, payload layout (offsets, sizes, ciphertext lengths);
5. expiry, target profile, anti-rollback;
6. SHA-256 of every encrypted payload, streamed (and of the whole file, for ``.sha256``).

:func:`verify_installed_bundle` is the agent's start-up path for a bundle that passed all of
the above at install: it runs 1–5 and checks that header, manifest and signature are byte for
byte the ones installed, but does not re-read the payloads. Nothing is lost by that: every
byte the device decrypts is authenticated again on the way (a GCM tag per segment and the
signed SHA-256 of the plaintext, see ``decrypt.py``), and those are the bytes it runs.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgesdk.bundle.background_hash import BackgroundHasher
from edgesdk.bundle.container import ContainerHeader, check_layout, signed_message
from edgesdk.bundle.reader import ContainerFront, iter_range, open_bundle_file, read_front
from edgesdk.errors import (
    BundleFormatError,
    ExpiredBundleError,
    IntegrityError,
    RollbackError,
    SchemaError,
    SignatureError,
    TargetMismatchError,
    UsageError,
)
from edgesdk.keys import key_id, load_publisher_public_key
from edgesdk.schemas.manifest import BundleManifest

if TYPE_CHECKING:  # only its name and parent are read: a device re-opening a bundle need not load profiles
    from edgesdk.schemas.profile import DeviceProfile

_TOKEN = object()

TrustedPublishers = Mapping[str, Ed25519PublicKey] | Iterable[Ed25519PublicKey | Path | str]


class VerifiedBundle:
    """A bundle whose signature, hashes, expiry, target and release were checked.

    Only :func:`verify_bundle` (and, for an installed bundle, :func:`verify_installed_bundle`)
    makes one; decryption and installation take nothing else. Instances are read-only.

    ``sha256`` is the whole file's SHA-256; ``front_sha256`` that of header + manifest +
    signature (what identifies the signed release cheaply). ``payloads_hashed`` is False for
    a bundle re-opened at start-up, whose ``sha256`` is the one recorded at install."""

    __slots__ = ("_header", "front_sha256", "manifest", "path", "payloads_hashed", "publisher_key_id", "sha256", "size")

    manifest: BundleManifest
    path: Path
    sha256: str
    front_sha256: str
    size: int
    publisher_key_id: str
    payloads_hashed: bool
    _header: ContainerHeader

    def __init__(self, *, _token: object, **fields: Any) -> None:
        if _token is not _TOKEN:
            raise TypeError("VerifiedBundle is made only by edgesdk.bundle.verify_bundle()")
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("VerifiedBundle is read-only")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("VerifiedBundle is read-only")

    def __reduce__(self) -> Any:
        # A pickle round trip would be a VerifiedBundle that verify_bundle() never saw.
        raise TypeError("VerifiedBundle cannot be pickled; verify the bundle file again")

    @property
    def payload_area_offset(self) -> int:
        """File offset of the payload area (where the manifest's payload offsets start)."""
        return self._header.payload_area_offset

    def __repr__(self) -> str:
        m = self.manifest.model
        return f"VerifiedBundle({m.name} {m.version} release {m.release}, {self.path}, sha256={self.sha256[:12]}…)"


def _trusted_keys(trusted_publishers: TrustedPublishers) -> dict[str, Ed25519PublicKey]:
    keys: dict[str, Ed25519PublicKey] = {}
    items = trusted_publishers.values() if isinstance(trusted_publishers, Mapping) else trusted_publishers
    for item in items:
        key = item if isinstance(item, Ed25519PublicKey) else load_publisher_public_key(item)
        keys[key_id(key)] = key
    return keys


def _as_utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _profile_names(profile: DeviceProfile | str) -> list[str]:
    if isinstance(profile, str):
        return [profile]
    # A profile derived from a stock one runs what was built for its parent.
    return [profile.name] + ([profile.extends] if profile.extends else [])


def check_policy(
    manifest: BundleManifest,
    *,
    source: str,
    profile: DeviceProfile | str | None,
    installed_release: int | None,
    now: datetime | None,
    allow_expired: bool = False,
    rollback_floor: int | None = None,
) -> None:
    """Expiry, target profile and anti-rollback of a manifest whose signature already checked."""
    moment = _as_utc(now or datetime.now(timezone.utc))
    if not allow_expired and manifest.expires is not None and moment >= _as_utc(manifest.expires):
        raise ExpiredBundleError(
            f"{source}: bundle expired at {_as_utc(manifest.expires).isoformat()} (now {moment.isoformat()})"
        )
    if profile is not None:
        names = _profile_names(profile)
        if not set(names) & set(manifest.targets):
            raise TargetMismatchError(
                f"{source}: bundle targets {', '.join(manifest.targets)}, not this device's profile {names[0]!r}"
            )
    check_release(
        manifest, source=source, installed_release=installed_release, rollback_floor=rollback_floor, now=moment
    )


def check_release(
    manifest: BundleManifest,
    *,
    source: str,
    installed_release: int | None,
    rollback_floor: int | None,
    now: datetime,
) -> None:
    """Anti-rollback: refuse a release below the device's rollback floor (the highest release
    it committed) or not newer than the release installed now, unless the manifest carries a
    signed ``downgrade`` permission whose ``from_releases`` hold the device's floor and whose
    ``expires_at`` has not passed. The unbounded ``allow_downgrade: true`` of older manifests is
    not honoured."""
    release = manifest.model.release
    refusal = None
    if rollback_floor is not None and release < rollback_floor:
        refusal = f"release {release} is below this device's rollback floor {rollback_floor}"
    elif installed_release is not None and release <= installed_release:
        refusal = f"release {release} is not newer than the installed release {installed_release}"
    if refusal is None:
        return
    permission = manifest.downgrade
    if permission is None:
        legacy = " (its unbounded allow_downgrade is no longer honoured)" if manifest.allow_downgrade else ""
        raise RollbackError(
            f"{source}: {refusal}: rollback refused{legacy}; a publisher can sign a bounded downgrade "
            "with --downgrade-from MIN-MAX --downgrade-expires"
        )
    current = rollback_floor if rollback_floor is not None else installed_release
    low, high = permission.from_releases
    if not low <= (current or 0) <= high:
        raise RollbackError(
            f"{source}: {refusal}, and the bundle's downgrade permission covers floors {low}-{high}, "
            f"not this device's {current}: downgrade refused"
        )
    expires_at = _as_utc(permission.expires_at)
    if now >= expires_at:
        raise RollbackError(
            f"{source}: {refusal}, and the bundle's downgrade permission expired at {expires_at.isoformat()} "
            f"(now {now.isoformat()}): downgrade refused"
        )


def verify_bundle(
    path: Path | str,
    *,
    trusted_publishers: TrustedPublishers,
    profile: DeviceProfile | str | None = None,
    installed_release: int | None = None,
    now: datetime | None = None,
    allow_expired: bool = False,
    rollback_floor: int | None = None,
) -> VerifiedBundle:
    """Check a bundle file completely and return it as a :class:`VerifiedBundle`.

    ``trusted_publishers``: Ed25519 public keys (objects, or paths of ``.pub`` files, or a
    mapping key id → key). ``profile``: the device's profile (name or DeviceProfile); None
    skips the target check. ``installed_release``: the release counter installed now;
    ``rollback_floor``: the device's floor (the highest release it committed, see
    ``edgesdk.agent.rollback_floor``); None skips the respective check. A release below the floor
    or not above ``installed_release`` is refused unless its signed ``downgrade`` permission
    holds the floor and has not expired. ``now``: the time to check expiry against (default: the clock).
    ``allow_expired``: skip only the expiry check — for re-verifying a bundle that was
    installed while it was valid (expiry stops *installing* stale bundles, not serving one).
    Raises a BundleError subclass naming what failed; nothing is returned half-checked."""
    path = Path(path)
    source = str(path)
    with open_bundle_file(path) as handle:
        front, manifest, signer_id = _check_front(
            handle,
            source=source,
            trusted_publishers=trusted_publishers,
            profile=profile,
            installed_release=installed_release,
            now=now,
            allow_expired=allow_expired,
            rollback_floor=rollback_floor,
        )
        file_hash = _hash_payloads(handle, manifest, front.header, front, source=source)
    return VerifiedBundle(
        _token=_TOKEN,
        manifest=manifest,
        path=path.resolve(),
        sha256=file_hash,
        front_sha256=_front_sha256(front),
        size=front.actual_size,
        publisher_key_id=signer_id,
        payloads_hashed=True,
        _header=front.header,
    )


def verify_installed_bundle(
    path: Path | str,
    *,
    trusted_publishers: TrustedPublishers,
    installed_front_sha256: str,
    installed_sha256: str,
    profile: DeviceProfile | str | None = None,
) -> VerifiedBundle:
    """Re-open a bundle that :func:`verify_bundle` fully checked when it was installed.

    For the agent's start: header, trusted signer, signature, manifest, layout and target
    profile are checked as at install, and header + manifest + signature must hash to
    ``installed_front_sha256`` (recorded at install), so the slot still holds the release
    that was installed and not another validly signed one. Expiry is not checked (it stops
    installing stale bundles, not serving one) and neither is anti-rollback (the store
    chose this slot). The payloads are not re-hashed: decryption authenticates every byte it
    hands out (GCM tag per segment, signed plaintext SHA-256), so rot or tampering in what
    is loaded is still caught, by ``decrypt_variant`` / ``decrypt_and_load``. The returned
    bundle's ``sha256`` is ``installed_sha256`` and ``payloads_hashed`` is False."""
    path = Path(path)
    source = str(path)
    with open_bundle_file(path) as handle:
        front, manifest, signer_id = _check_front(
            handle,
            source=source,
            trusted_publishers=trusted_publishers,
            profile=profile,
            installed_release=None,
            now=None,
            allow_expired=True,
        )
    front_sha256 = _front_sha256(front)
    if front_sha256 != installed_front_sha256:
        raise IntegrityError(
            f"{source}: header and manifest are not the ones installed "
            f"(sha256 {front_sha256}, installed {installed_front_sha256})"
        )
    return VerifiedBundle(
        _token=_TOKEN,
        manifest=manifest,
        # The store's own path: absolute() costs no syscalls, unlike resolve() (~80 µs with
        # cold caches, a tenth of a small model's session); decryption authenticates anyway.
        path=path.absolute(),
        sha256=installed_sha256,
        front_sha256=front_sha256,
        size=front.actual_size,
        publisher_key_id=signer_id,
        payloads_hashed=False,
        _header=front.header,
    )


def _front_sha256(front: ContainerFront) -> str:
    return hashlib.sha256(front.header.raw + front.manifest_bytes + front.signature).hexdigest()


def _check_front(
    handle: io.BufferedReader,
    *,
    source: str,
    trusted_publishers: TrustedPublishers,
    profile: DeviceProfile | str | None,
    installed_release: int | None,
    now: datetime | None,
    allow_expired: bool,
    rollback_floor: int | None = None,
) -> tuple[ContainerFront, BundleManifest, str]:
    """Checks 1–5: header, signer, signature, manifest, layout, policy. Nothing is parsed
    before the signature holds."""
    trusted = _trusted_keys(trusted_publishers)
    if not trusted:
        raise UsageError("no trusted publisher keys given; pass at least one publisher public key")
    front = read_front(handle, source=source)
    header = front.header
    signer_id = header.publisher_key_id.hex()
    publisher = trusted.get(signer_id)
    if publisher is None:
        raise SignatureError(
            f"{source}: signed by unknown publisher key {signer_id}; trusted: {', '.join(sorted(trusted))}"
        )
    try:
        publisher.verify(front.signature, signed_message(header.raw, front.manifest_bytes))
    except InvalidSignature as exc:
        raise SignatureError(
            f"{source}: manifest signature does not verify with publisher key {signer_id} (tampered header or manifest)"
        ) from exc
    try:
        manifest = BundleManifest.parse_json_clear(front.manifest_bytes, source=f"{source}: manifest")
    except SchemaError as exc:
        # Signed but unreadable: written by a newer or broken packager.
        raise BundleFormatError(str(exc)) from exc
    if manifest.publisher.key_id != signer_id:
        raise SignatureError(
            f"{source}: manifest names publisher key {manifest.publisher.key_id}, but {signer_id} signed it"
        )
    check_layout(manifest, header, source=source)
    check_policy(
        manifest,
        source=source,
        profile=profile,
        installed_release=installed_release,
        now=now,
        allow_expired=allow_expired,
        rollback_floor=rollback_floor,
    )
    return front, manifest, signer_id


def _hash_payloads(
    handle: io.BufferedReader, manifest: BundleManifest, header: ContainerHeader, front: ContainerFront, *, source: str
) -> str:
    """Stream every encrypted payload through SHA-256 and compare with the manifest; also
    return the SHA-256 of the whole file, computed in the same pass."""
    expected = {v.payload: v.encrypted_sha256 for v in manifest.variants}
    if manifest.golden is not None:
        expected[manifest.golden.payload] = manifest.golden.encrypted_sha256
    encryption = manifest.encryption
    if encryption is None:  # check_layout refused this already; keeps the type checker honest
        raise BundleFormatError(f"{source}: manifest has no encryption section")
    front_bytes = header.raw + front.manifest_bytes + front.signature
    with BackgroundHasher(hashlib.sha256(front_bytes), expected_bytes=header.payload_area_length) as whole:
        for location in sorted(encryption.payloads, key=lambda item: item.offset):
            digest = hashlib.sha256()
            chunks = iter_range(handle, header.payload_area_offset + location.offset, location.length, source=source)
            for chunk in chunks:
                whole.update(chunk)  # on the worker thread, while this one hashes the payload
                digest.update(chunk)
            if digest.hexdigest() != expected[location.name]:
                raise IntegrityError(
                    f"{source}: payload {location.name!r} does not match its signed SHA-256 (tampered or corrupted)"
                )
        return whole.hexdigest()
