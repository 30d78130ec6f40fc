"""Making, signing and checking trust documents (:class:`~edgesdk.schemas.trust.TrustDocument`).

The rules, after TUF's root metadata (TUF specification §5.3):

- **loading** the trusted document (at agent start): a threshold of its *own* root keys must
  have signed it (:func:`verify_self`) — a damaged or edited file is refused;
- **replacing** it (:func:`verify_update`): the newcomer must be signed by a threshold of the
  *current* root's keys (whoever holds the old root agreed) and by a threshold of its *own*
  root's keys (the new root holders can sign: a rotation cannot lock the fleet out), its
  version must be higher (an older or equal one is a rollback or a replay) and it must not
  already have expired;
- **expiry** (:func:`require_current`): an expired document is not trusted for *new* content
  (deployments, bundle installs) — a freeze attack that keeps a device on old keys shows up
  as refusals naming the expiry — while what is installed goes on serving and a newer
  document is still accepted (the only way out, as in TUF).

The crypto library is imported where it is used, as in :mod:`edgesdk.protocol.signing`:
the agent imports this module at start only to read a document's fields.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from edgesdk.errors import SchemaError, TrustError, TrustExpiredError, TrustRollbackError
from edgesdk.schemas.trust import TrustDocument, TrustRole

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

_PREFIX = "ed25519"
#: A trust document lists a few keys; anything much larger is not one.
MAX_DOCUMENT_BYTES = 256 * 1024


def canonical_bytes(document: TrustDocument) -> bytes:
    """The exact bytes root keys sign: the document without ``signatures``, keys sorted, no spaces."""
    data = document.model_dump(mode="json", exclude={"signatures"})
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def role_of(keys: Iterable[Ed25519PublicKey], threshold: int = 1) -> TrustRole:
    """A role listing ``keys`` (objects) with ``threshold``."""
    from cryptography.hazmat.primitives import serialization

    from edgesdk.keys import key_id

    entries = {
        key_id(key): base64.b64encode(
            key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        ).decode()
        for key in keys
    }
    return TrustRole.parse_obj_clear({"keys": entries, "threshold": threshold}, source="trust role")


def role_keys(role: TrustRole) -> list[Ed25519PublicKey]:
    """The role's keys as objects (what ``verify_bundle`` and ``verify_deployment`` take)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return [Ed25519PublicKey.from_public_bytes(base64.b64decode(raw)) for raw in role.keys.values()]


def sign_document(document: TrustDocument, private_keys: Iterable[Ed25519PrivateKey]) -> TrustDocument:
    """A copy of ``document`` with a signature by each of ``private_keys`` added (replacing an
    earlier signature by the same key; signatures by other keys are kept, so root holders can
    sign one after another)."""
    from edgesdk.keys import key_id

    message = canonical_bytes(document)
    signatures = {_signer(entry): entry for entry in document.signatures}
    for private in private_keys:
        signer = key_id(private.public_key())
        signatures[signer] = f"{_PREFIX}:{signer}:{base64.b64encode(private.sign(message)).decode()}"
    return document.model_copy(update={"signatures": [signatures[k] for k in sorted(signatures)]})


def _signer(entry: str) -> str:
    parts = entry.split(":")
    return parts[1] if len(parts) == 3 else entry


def valid_signers(document: TrustDocument, role: TrustRole) -> set[str]:
    """Ids of ``role``'s keys whose signature on ``document`` verifies (each key counts once)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    message = canonical_bytes(document)
    signers: set[str] = set()
    for entry in document.signatures:
        parts = entry.split(":")
        if len(parts) != 3 or parts[0] != _PREFIX or parts[1] not in role.keys or parts[1] in signers:
            continue  # malformed, or a key this role does not list: it counts for nothing
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(role.keys[parts[1]]))
        try:
            key.verify(base64.b64decode(parts[2], validate=True), message)
        except (InvalidSignature, binascii.Error, ValueError):
            continue
        signers.add(parts[1])
    return signers


def _require_threshold(document: TrustDocument, role: TrustRole, whose: str) -> None:
    signers = valid_signers(document, role)
    if len(signers) < role.threshold:
        raise TrustError(
            f"trust document version {document.version} is signed by {len(signers)} of {whose} root keys; "
            f"it needs {role.threshold} (known: {', '.join(sorted(role.keys))})"
        )


def verify_self(document: TrustDocument) -> None:
    """TrustError unless a threshold of the document's own root keys signed it."""
    _require_threshold(document, document.roles.root, "its own")


def verify_update(current: TrustDocument, new: TrustDocument, *, now: datetime | None = None) -> None:
    """Check that ``new`` may replace the trusted ``current`` (see the module docstring).

    Raises TrustRollbackError (version not higher), TrustExpiredError (``new`` has expired)
    or TrustError (not signed by the old or by its own root threshold)."""
    if new.version <= current.version:
        raise TrustRollbackError(
            f"trust document version {new.version} is not newer than the trusted version {current.version} "
            "(rollback or replay refused)"
        )
    _require_threshold(new, current.roles.root, f"the trusted (version {current.version})")
    _require_threshold(new, new.roles.root, "its own")
    require_current(new, now=now)


def require_current(document: TrustDocument, *, now: datetime | None = None) -> None:
    """TrustExpiredError when ``document`` has expired (no new content may be trusted with it)."""
    now = now or datetime.now(timezone.utc)
    if document.is_expired(now):
        raise TrustExpiredError(
            f"trust document version {document.version} expired at {document.expires_at.isoformat()}; "
            "new content is refused until a newer one is installed (edgesdk trust sign, then push or "
            "edge-agent trust install)"
        )


def parse_document(raw: bytes, *, source: str) -> TrustDocument:
    """A document from JSON bytes; TrustError naming ``source`` when it is not one."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise TrustError(f"{source}: {len(raw)} bytes; a trust document is under {MAX_DOCUMENT_BYTES}")
    try:
        return TrustDocument.parse_json_clear(raw, source=source)
    except SchemaError as exc:
        raise TrustError(str(exc)) from exc


def load_document(path: Path | str) -> TrustDocument:
    """Read a document file (fields only; no signature is checked here)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TrustError(f"trust document {path}: {exc.strerror or exc}") from exc
    return parse_document(raw, source=f"trust document {path}")


def document_bytes(document: TrustDocument) -> bytes:
    """The file form: indented JSON (what ``edgesdk trust sign`` writes and devices persist)."""
    return (document.model_dump_json(indent=2) + "\n").encode()
