"""Signing roles: the root-signed trust document that names publisher and operator keys.

Shared by the host tools (``edgesdk trust sign|show|push``) and the device agent; nothing here
imports the agent. See ``docs/trust.md``.
"""

from __future__ import annotations

from edgesdk.trust.document import (
    canonical_bytes,
    document_bytes,
    load_document,
    parse_document,
    require_current,
    role_keys,
    role_of,
    sign_document,
    valid_signers,
    verify_self,
    verify_update,
)

__all__ = [
    "canonical_bytes",
    "document_bytes",
    "load_document",
    "parse_document",
    "require_current",
    "role_keys",
    "role_of",
    "sign_document",
    "valid_signers",
    "verify_self",
    "verify_update",
]
