"""Signed Deployment messages: Ed25519 by the operator over canonical JSON.

Canonical JSON = the Deployment as JSON without its ``signature`` field, keys sorted, no
whitespace, UTF-8. The signature field reads ``ed25519:<key id>:<base64 signature>`` so the
device knows which of its trusted keys to check with. A device acts on no deployment whose
signature does not verify — not even a cancel.

A command is named by its *digest*: the sha256 of the message bytes exactly as published
(:func:`command_payload`). The operator keeps the digest of every command it issues; a device
that refuses a command reports that digest, so the operator can tell a refusal of its own
command from a refusal of a forged or replayed copy (docs/ota.md, "Refusals").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from edgesdk.errors import SignatureError
from edgesdk.schemas.messages import Deployment

# The crypto is imported where it is used: the daemon imports this module at start (the OTA
# manager resumes updates), and most starts never see a deployment (see edgesdk.agent.unseal).
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

_PREFIX = "ed25519"
#: Deployment fields newer than the first signed format, with the default that omits them.
_LATER_FIELDS: dict[str, object] = {"artifact_urls": [], "mqtt_fallback": True}


def canonical_json(deployment: Deployment) -> bytes:
    """The exact bytes that are signed."""
    data = deployment.model_dump(mode="json", exclude={"signature"})
    # Fields added after deployments were first signed are left out at their defaults, so a
    # command signed by an older fleet still verifies on a newer device (and the reverse).
    for name, default in _LATER_FIELDS.items():
        if data.get(name) == default:
            del data[name]
    for name in _unset_health_fields(deployment):
        del data["health"][name]
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign_deployment(deployment: Deployment, private_key: Ed25519PrivateKey) -> Deployment:
    """A copy of ``deployment`` carrying the operator's signature."""
    from edgesdk.keys import key_id

    unsigned = deployment.model_copy(update={"signature": None})
    raw = private_key.sign(canonical_json(unsigned))
    signature = f"{_PREFIX}:{key_id(private_key.public_key())}:{base64.b64encode(raw).decode()}"
    return unsigned.model_copy(update={"signature": signature})


def trusted_key_map(trusted: Any) -> dict[str, Ed25519PublicKey]:
    """Key id → key from a mapping, an iterable of keys, or paths of ``.pub`` files."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from edgesdk.keys import key_id, load_publisher_public_key

    items: Iterable[Any] = trusted.values() if isinstance(trusted, Mapping) else (trusted or [])
    keys: dict[str, Ed25519PublicKey] = {}
    for item in items:
        key = item if isinstance(item, Ed25519PublicKey) else load_publisher_public_key(item)
        keys[key_id(key)] = key
    return keys


def command_payload(deployment: Deployment) -> bytes:
    """The bytes a command is published as (and its digest is taken of)."""
    # Health fields newer than a device's agent are left out when unused: its schema forbids them.
    unset = _unset_health_fields(deployment)
    return deployment.model_dump_json(exclude={"health": unset} if unset else None).encode()


def _unset_health_fields(command: Deployment) -> set[str]:
    """Health fields newer than the first signed format at their default (a re-provision has no health)."""
    health = getattr(command, "health", None)
    return health.later_fields_unset() if health is not None else set()


def command_digest(payload: bytes) -> str:
    """The sha256 (hex) of a command message as published or received: what a refusal quotes."""
    return hashlib.sha256(payload).hexdigest()


#: Why a signature check failed, as a device reports it (``CommandRefusal.why``).
SignatureProblem = Literal["unsigned", "malformed_signature", "unknown_key", "bad_signature"]


@dataclass(frozen=True)
class Unverified:
    """A deployment whose signature did not verify: which check failed, and the message."""

    why: SignatureProblem
    message: str


def check_deployment(deployment: Deployment, trusted: Any) -> str | Unverified:
    """The signer's key id when the signature verifies with one of the ``trusted`` keys, else
    what is wrong (missing, malformed, unknown key, bad signature)."""
    if not deployment.signature:
        return Unverified("unsigned", f"deployment {deployment.deployment_id!r} is not signed")
    parts = deployment.signature.split(":")
    if len(parts) != 3 or parts[0] != _PREFIX:
        return Unverified("malformed_signature", f"deployment {deployment.deployment_id!r}: malformed signature field")
    from cryptography.exceptions import InvalidSignature

    _, signer, encoded = parts
    keys = trusted_key_map(trusted)
    key = keys.get(signer)
    if key is None:
        return Unverified(
            "unknown_key",
            f"deployment {deployment.deployment_id!r} signed by unknown key {signer}; "
            f"trusted: {', '.join(sorted(keys)) or 'none'}",
        )
    try:
        key.verify(base64.b64decode(encoded, validate=True), canonical_json(deployment))
    except (InvalidSignature, binascii.Error, ValueError):
        return Unverified(
            "bad_signature",
            f"deployment {deployment.deployment_id!r}: signature does not verify with key {signer} (tampered?)",
        )
    return signer


def verify_deployment(deployment: Deployment, trusted: Any) -> str:
    """Check the signature against the trusted keys; return the signer's key id.

    Raises SignatureError naming what is wrong (missing, malformed, unknown key, bad signature)."""
    checked = check_deployment(deployment, trusted)
    if isinstance(checked, Unverified):
        raise SignatureError(checked.message)
    return checked
