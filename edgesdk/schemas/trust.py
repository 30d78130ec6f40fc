"""TrustDocument: which keys a device trusts, for which role, signed by the offline root.

Three roles, never interchangeable (TUF's root / targets split, cut to what a device does):

- **root** signs trust documents. Its private keys stay offline; a new document must be
  signed by a threshold of the *current* root's keys (and of its own root's), so rotating or
  revoking any key is a new document, never a re-image.
- **publisher** keys sign bundle manifests (what may run).
- **operator** keys sign deployments, rollbacks and aborts (when and where it runs). The
  fleet server holds one online; with roles separated, that key cannot ship a model.

A key is its raw 32-byte Ed25519 public key in base64, listed under its key id (the first 16
bytes of its SHA-256, in hex: how bundles and deployments name their signers). The id is
checked against the key here, so a document cannot name one key and carry another.

Signatures are over the canonical JSON of the document without ``signatures`` (keys sorted,
no whitespace, UTF-8: the rule deployments follow, :mod:`edgesdk.protocol.signing`), each
``ed25519:<key id>:<base64 signature>``. Checking them needs the crypto library and lives
in :mod:`edgesdk.trust`; this module is the shape only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, Field, field_validator, model_validator

from edgesdk.schemas.base import SCHEMA_VERSION, Schema

_KEY_ID = re.compile(r"^[0-9a-f]{32}$")
ROLE_NAMES = ("root", "publisher", "operator")


class TrustRole(Schema):
    """The keys of one role and how many of them must sign."""

    keys: dict[str, str] = Field(description="key id → raw Ed25519 public key (32 bytes), base64")
    threshold: int = Field(1, ge=1, description="distinct keys of this role that must sign")

    @field_validator("keys")
    @classmethod
    def _ids_match_keys(cls, keys: dict[str, str]) -> dict[str, str]:
        if not keys:
            raise ValueError("a role needs at least one key")
        for identifier, encoded in keys.items():
            if not _KEY_ID.match(identifier):
                raise ValueError(f"key id {identifier!r} is not 32 lowercase hex digits")
            try:
                raw = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"key {identifier}: not base64") from None
            if len(raw) != 32:
                raise ValueError(f"key {identifier}: {len(raw)} bytes; an Ed25519 public key is 32")
            if hashlib.sha256(raw).digest()[:16].hex() != identifier:
                raise ValueError(f"key {identifier}: the id is not the SHA-256 of the key it names")
        return keys

    @model_validator(mode="after")
    def _threshold_reachable(self) -> TrustRole:
        if self.threshold > len(self.keys):
            raise ValueError(f"threshold {self.threshold} is more than the role's {len(self.keys)} key(s)")
        return self


class TrustRoles(Schema):
    root: TrustRole
    publisher: TrustRole
    operator: TrustRole

    @model_validator(mode="after")
    def _roles_separated(self) -> TrustRoles:
        # A key in two roles would undo the split: the online operator key signing models, or
        # the offline root doubling as a day-to-day signer.
        seen: dict[str, str] = {}
        for role in ROLE_NAMES:
            for identifier in getattr(self, role).keys:
                if identifier in seen:
                    raise ValueError(f"key {identifier} is in both the {seen[identifier]} and the {role} role")
                seen[identifier] = role
        # A bundle manifest and a deployment carry one signature each, so a threshold above 1
        # could never be met for these roles (the root role signs documents, which carry many).
        for role in ("publisher", "operator"):
            if getattr(self, role).threshold != 1:
                raise ValueError(
                    f"{role} threshold {getattr(self, role).threshold}: bundles and deployments carry one "
                    "signature, so only the root role takes a threshold above 1"
                )
        return self


class TrustDocument(Schema):
    """A versioned, expiring list of trusted keys per role, signed by root keys."""

    schema_version: Literal[1] = SCHEMA_VERSION
    version: int = Field(ge=1, description="increases with every new document; a lower or equal one is refused")
    expires_at: AwareDatetime = Field(description="after this the device takes no new content until a newer document")
    roles: TrustRoles
    signatures: list[str] = Field(default_factory=list, description="ed25519:<root key id>:<base64 signature>")

    def is_expired(self, now: datetime) -> bool:
        """True when ``now`` (timezone-aware) is at or past ``expires_at``."""
        return now >= self.expires_at
