"""Enrollment on the operator's side: who asks to join, approving keys, revoking them.

Each device makes its own X25519 key pair on first start and announces the public half
(retained ``enroll`` request and its presence). The operator approves a device into a
registry file (:class:`~edgesdk.schemas.enrollment.EnrollmentRegistry`, JSON); bundles are
then packaged for the approved keys (:func:`recipients_from_registry`, ``edgesdk package
--recipients-from-registry``). A revoked key gets no key slot in any bundle packaged after
the revocation, so the device cannot decrypt them. See docs/enrollment.md.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import os
import secrets
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from pydantic import ValidationError

from edgesdk.errors import EdgeSDKError, EnrollmentError, SchemaError
from edgesdk.keys import key_id
from edgesdk.schemas.enrollment import EnrolledDevice, EnrollmentRegistry
from edgesdk.schemas.messages import EnrollRequest, Presence

if TYPE_CHECKING:
    from edgesdk.mqtt.client import ClientOptions

DEFAULT_REGISTRY = Path("edgesdk-enrollment.json")
REGISTRY_ENV = "EDGESDK_ENROLLMENT_REGISTRY"


def encode_public_key(public_key: X25519PublicKey) -> str:
    """Raw 32-byte public key in base64 (how requests and the registry carry it)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def decode_public_key(text: str) -> X25519PublicKey:
    """An X25519 public key from base64 (raw 32 bytes) or from a PEM file path."""
    candidate = Path(text)
    if len(text) < 200 and candidate.is_file():
        from edgesdk.keys import load_device_public_key

        return load_device_public_key(candidate)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EnrollmentError(f"public key {text!r} is neither base64 nor a key file") from exc
    if len(raw) != 32:
        raise EnrollmentError(f"public key {text!r} decodes to {len(raw)} bytes; an X25519 key has 32")
    return X25519PublicKey.from_public_bytes(raw)


class RegistryFile:
    """The registry JSON file; changes are locked (flock) and written atomically."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def load(self) -> EnrollmentRegistry:
        """The registry; an absent file is an empty registry."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return EnrollmentRegistry()
        except OSError as exc:
            raise EnrollmentError(f"cannot read enrollment registry {self.path}: {exc.strerror or exc}") from exc
        try:
            return EnrollmentRegistry.parse_json_clear(raw, source=f"enrollment registry {self.path}")
        except SchemaError as exc:
            raise EnrollmentError(str(exc)) from exc

    def _save(self, registry: EnrollmentRegistry) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(registry.model_dump_json(indent=2) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o600)  # the fleet's key list and decisions: the owner's alone
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @contextmanager
    def _locked(self) -> Iterator[EnrollmentRegistry]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two operators approving at once must not lose one
            yield self.load()

    def approve(
        self,
        device_id: str,
        public_key: X25519PublicKey,
        *,
        profile: str | None = None,
        expect_key_id: str | None = None,
        replace: bool = False,
        allow_shared_key: bool = False,
        now: datetime | None = None,
    ) -> EnrolledDevice:
        """Approve ``device_id`` with ``public_key``; refuses a revoked key, silent key changes,
        and (unless ``allow_shared_key``) a key already approved for another device."""
        kid = key_id(public_key)
        if expect_key_id is not None and expect_key_id.lower() != kid:
            raise EnrollmentError(
                f"device {device_id!r} offers key id {kid}, not the expected {expect_key_id}: do not approve it "
                "unless you can explain the difference"
            )
        with self._locked() as registry:
            current = registry.devices.get(device_id)
            revoked_ids = list(current.revoked_key_ids) if current else []
            if current is not None and current.status == "revoked":
                revoked_ids = list(dict.fromkeys([*revoked_ids, current.key_id]))
            if kid in revoked_ids:
                raise EnrollmentError(
                    f"key {kid} of device {device_id!r} was revoked and is never approved again; "
                    "the device must make a new key (remove its device.key and restart the agent)"
                )
            if current is not None and current.status == "approved":
                if current.key_id == kid:
                    return current
                if not replace:
                    raise EnrollmentError(
                        f"device {device_id!r} is approved with key {current.key_id} but now offers {kid}; "
                        "pass --replace if the device was re-flashed on purpose"
                    )
                revoked_ids.append(current.key_id)
            revoked_elsewhere = [
                name
                for name, other in sorted(registry.devices.items())
                if name != device_id
                and (kid in other.revoked_key_ids or (other.status == "revoked" and other.key_id == kid))
            ]
            if revoked_elsewhere:
                # A stolen device's revoked key must not come back under another name.
                raise EnrollmentError(
                    f"key {kid} was revoked for device {revoked_elsewhere[0]!r} and is never approved again, "
                    f"under any device id; {device_id!r} must make a new key"
                )
            sharing = shared_key_devices(registry, device_id, kid)
            if sharing and not allow_shared_key:
                # One key on two devices is a cloned image or a copied key file: either device
                # can then read what is addressed to the other, and revoking one cuts off both.
                raise EnrollmentError(
                    f"key {kid} is already approved for device {', '.join(repr(n) for n in sharing)}: one key "
                    f"per device (an image or key file copied?); pass --allow-shared-key (REST: allow_shared_key) "
                    f"to approve {device_id!r} with it anyway"
                )
            try:
                entry = EnrolledDevice(
                    device_id=device_id,
                    public_key=encode_public_key(public_key),
                    key_id=kid,
                    status="approved",
                    profile=profile,
                    approved_at=now or datetime.now(timezone.utc),
                    revoked_key_ids=revoked_ids,
                )
            except ValidationError as exc:
                raise EnrollmentError(f"cannot approve device {device_id!r}: {exc.errors()[0]['msg']}") from exc
            self._save(registry.model_copy(update={"devices": {**registry.devices, device_id: entry}}))
            return entry

    def revoke(self, device_id: str, *, reason: str = "", now: datetime | None = None) -> EnrolledDevice:
        """Revoke ``device_id``: bundles packaged from now on have no key slot for it."""
        with self._locked() as registry:
            current = registry.devices.get(device_id)
            if current is None:
                known = ", ".join(sorted(registry.devices)) or "none"
                raise EnrollmentError(f"device {device_id!r} is not in registry {self.path}; known: {known}")
            if current.status == "revoked":
                return current
            entry = current.model_copy(
                update={"status": "revoked", "revoked_at": now or datetime.now(timezone.utc), "reason": reason}
            )
            self._save(registry.model_copy(update={"devices": {**registry.devices, device_id: entry}}))
            return entry

    def approved(self) -> list[EnrolledDevice]:
        """Approved devices, by device id."""
        devices = self.load().devices
        return [devices[name] for name in sorted(devices) if devices[name].status == "approved"]


def shared_key_devices(registry: EnrollmentRegistry, device_id: str, kid: str) -> list[str]:
    """Other devices approved with key ``kid``, by id (a shared key is refused unless allowed)."""
    return [
        name
        for name, entry in sorted(registry.devices.items())
        if name != device_id and entry.status == "approved" and entry.key_id == kid
    ]


def recipients_from_registry(path: Path | str) -> list[X25519PublicKey]:
    """Public keys of every approved device: the recipients of the next bundle."""
    registry = RegistryFile(path)
    if not registry.path.is_file():
        raise EnrollmentError(f"enrollment registry {registry.path} does not exist; approve a device first")
    approved = registry.approved()
    if not approved:
        raise EnrollmentError(f"enrollment registry {registry.path} has no approved device")
    return [decode_public_key(entry.public_key) for entry in approved]


def recipients_from_service(rows: list[dict[str, object]], server: str) -> list[X25519PublicKey]:
    """Public keys of every device approved on a fleet service, from its enrollment list
    (``GET /api/v1/enrollment``: an approved row holds the approved key; a key offered since
    is in ``offered_*`` and is not a recipient until it is approved)."""
    keys = []
    for row in rows:
        if row.get("status") != "approved":
            continue
        public = decode_public_key(str(row["public_key"]))
        if key_id(public) != row.get("key_id"):
            raise EnrollmentError(f"fleet service {server}: device {row.get('device_id')!r} lists a key not its key id")
        keys.append(public)
    if not keys:
        raise EnrollmentError(f"fleet service {server} has no approved device (edgesdk fleet enroll list --server)")
    return keys


@dataclass(frozen=True)
class Candidate:
    """A device seen asking to enroll (its enroll request) or announcing its key (presence)."""

    device_id: str
    public_key: str
    key_id: str
    profile: str | None
    agent_version: str | None
    seen_via: str
    ts: datetime


def candidate_from_message(suffix: str, payload: bytes) -> Candidate | None:
    """A Candidate from an ``enroll`` or ``presence`` payload; None when it carries no valid key."""
    try:
        if suffix == "enroll":
            request = EnrollRequest.model_validate_json(payload)
            public = decode_public_key(request.public_key)
            if key_id(public) != request.key_id:
                return None  # a key id that does not match its key is a forgery or a bug
            return Candidate(
                request.device_id,
                request.public_key,
                request.key_id,
                request.profile,
                request.agent_version,
                "enroll",
                request.ts,
            )
        presence = Presence.model_validate_json(payload)
    except (ValidationError, EdgeSDKError, ValueError):
        return None
    if presence.public_key is None:
        return None
    try:
        public = decode_public_key(presence.public_key)
    except EnrollmentError:
        return None
    return Candidate(
        presence.device_id,
        presence.public_key,
        key_id(public),
        presence.profile,
        presence.agent_version,
        "presence",
        presence.ts,
    )


def discover_candidates(
    broker: str | ClientOptions,
    *,
    namespace: str = "edgesdk",
    wait_s: float = 2.0,
    connect_timeout_s: float = 5.0,
) -> dict[str, Candidate]:
    """Devices whose retained enroll request or presence is on the broker, by device id.

    ``broker`` is a URL (anonymous, system CAs for mqtts://) or full ``ClientOptions``
    (credentials, CA, client certificate). An enroll request wins over presence for the same
    device (it is the explicit ask).
    """
    from edgesdk.mqtt.client import ClientOptions, MqttClient, TlsSettings
    from edgesdk.protocol import topics

    if isinstance(broker, str):
        broker = ClientOptions(
            client_id=f"edgesdk-enroll-{secrets.token_hex(4)}",
            broker_url=broker,
            tls=TlsSettings() if broker.startswith("mqtts://") else None,
            clean_start=True,
            session_expiry_s=0,
        )
    found: dict[str, Candidate] = {}
    lock = threading.Lock()

    def on_message(topic: str, payload: bytes) -> None:
        parsed = topics.parse_topic(namespace, topic)
        if parsed is None or parsed.scope != "devices":
            return
        candidate = candidate_from_message(parsed.suffix, payload)
        if candidate is None or candidate.device_id != parsed.name:
            return  # a device may only speak for its own topic
        with lock:
            if parsed.suffix == "enroll" or candidate.device_id not in found:
                found[candidate.device_id] = candidate

    client = MqttClient(broker)
    client.on_message = on_message
    client.subscribe(topics.all_devices_filter(namespace, topics.ENROLL))
    client.subscribe(topics.all_devices_filter(namespace, topics.PRESENCE))
    client.start()
    try:
        if not client.wait_connected(connect_timeout_s):
            reason = client.stats.last_error or "no answer"
            raise EnrollmentError(f"cannot reach broker {broker.broker_url}: {reason}")
        threading.Event().wait(wait_s)  # retained messages arrive right after SUBACK
    finally:
        client.stop(graceful=True)
    with lock:
        return dict(found)


def enrollment_table(registry: EnrollmentRegistry, candidates: dict[str, Candidate]) -> list[dict[str, object]]:
    """One row per device known to the registry or the broker, with its enrollment status."""
    rows: list[dict[str, object]] = []
    for device_id in sorted({*registry.devices, *candidates}):
        entry = registry.devices.get(device_id)
        seen = candidates.get(device_id)
        status: str = entry.status if entry is not None else "pending"
        if entry is not None and seen is not None and seen.key_id != entry.key_id:
            # The device now offers another key (re-flashed, or someone speaking for it).
            status = "revoked, new key pending" if entry.status == "revoked" else "key changed"
        rows.append(
            {
                "device_id": device_id,
                "status": status,
                "key_id": entry.key_id if entry is not None else seen.key_id if seen else None,
                "offered_key_id": seen.key_id if seen is not None else None,
                "profile": (entry.profile if entry is not None else None) or (seen.profile if seen else None),
                "seen_via": seen.seen_via if seen is not None else None,
                "approved_at": entry.approved_at.isoformat() if entry is not None else None,
                "revoked_at": entry.revoked_at.isoformat() if entry is not None and entry.revoked_at else None,
            }
        )
    return rows


def registry_path(value: str | Path | None) -> Path:
    """The registry path: the option, else $EDGESDK_ENROLLMENT_REGISTRY, else ./edgesdk-enrollment.json."""
    if value is not None:
        return Path(value)
    return Path(os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY)
