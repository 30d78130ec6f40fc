"""Trust documents for tests: real Ed25519 root keys, documents signed with the library code."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from edgesdk.keys import generate_root_key, load_publisher_private_key, load_publisher_public_key
from edgesdk.schemas.trust import TrustDocument
from edgesdk.trust import document_bytes, role_of, sign_document


def make_root(directory: Path) -> tuple[Path, Path]:
    """A root key pair under ``directory`` (root.key, root.pub)."""
    return generate_root_key(directory)


def trust_document(
    *,
    version: int,
    root_pubs: Sequence[Path],
    publisher_pubs: Sequence[Path],
    operator_pubs: Sequence[Path],
    signers: Sequence[Path],
    root_threshold: int = 1,
    expires_at: datetime | None = None,
) -> TrustDocument:
    """A document naming those public keys, signed by the ``signers`` private keys."""
    document = TrustDocument.parse_obj_clear(
        {
            "version": version,
            "expires_at": expires_at or datetime.now(timezone.utc) + timedelta(days=30),
            "roles": {
                "root": role_of([load_publisher_public_key(p) for p in root_pubs], root_threshold),
                "publisher": role_of([load_publisher_public_key(p) for p in publisher_pubs]),
                "operator": role_of([load_publisher_public_key(p) for p in operator_pubs]),
            },
        },
        source="test trust document",
    )
    return sign_document(document, [load_publisher_private_key(p) for p in signers])


def write_document(document: TrustDocument, path: Path) -> Path:
    path.write_bytes(document_bytes(document))
    return path
