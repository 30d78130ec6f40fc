"""Operator tokens and their roles: who may read, who may change the fleet.

A token is ``esf_<id>_<secret>`` (256 random bits); the database keeps only its SHA-256, so a
copy of the database gives no usable token. Tokens are created on the service's host
(``edgesdk fleet serve token create --role …``) or through the API by an admin, shown once.

Roles are cumulative: a viewer reads; an operator also creates, aborts and rolls back
deployments, uploads bundles and approves enrollment; an admin also revokes devices and
manages tokens.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from edgesdk.errors import UsageError
from edgesdk.fleet.service import schema
from edgesdk.fleet.service.database import Transaction

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "operator", "admin")
_RANK: dict[str, int] = {role: index for index, role in enumerate(ROLES)}


def allows(role: str, needed: Role) -> bool:
    """Whether ``role`` may do what needs ``needed``."""
    return _RANK.get(role, -1) >= _RANK[needed]


@dataclass(frozen=True)
class Operator:
    """Who presented a valid token."""

    token_id: str
    name: str
    role: Role

    @property
    def actor(self) -> str:
        return f"{self.name} ({self.token_id})"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(engine: Any, *, name: str, role: str, created_by: str) -> tuple[str, str]:
    """A new token for ``name`` with ``role``; returns (token id, the token — shown once)."""
    if role not in ROLES:
        raise UsageError(f"bad role {role!r}: expected one of {', '.join(ROLES)}")
    if not name.strip() or len(name) > 128:
        raise UsageError(f"bad token name {name!r}: 1 to 128 characters")
    token_id = secrets.token_hex(4)
    token = f"esf_{token_id}_{secrets.token_urlsafe(32)}"
    with Transaction(engine) as db:
        db.execute(
            schema.operator_tokens.insert().values(
                id=token_id,
                name=name,
                role=role,
                token_sha256=_digest(token),
                created=time.time(),
                created_by=created_by,
            )
        )
    return token_id, token


def authenticate(engine: Any, token: str) -> Operator | None:
    """The operator a token belongs to, or None (unknown, malformed or revoked)."""
    if not token.startswith("esf_") or len(token) > 200:
        return None
    table = schema.operator_tokens
    with Transaction(engine) as db:
        row = db.execute(sa.select(table).where(table.c.token_sha256 == _digest(token))).first()
    if row is None or row.revoked is not None or row.role not in ROLES:
        return None
    return Operator(token_id=row.id, name=row.name, role=row.role)


def list_tokens(engine: Any) -> list[dict[str, Any]]:
    table = schema.operator_tokens
    with Transaction(engine) as db:
        rows = db.execute(sa.select(table).order_by(table.c.created)).all()
    return [
        {
            "id": r.id,
            "name": r.name,
            "role": r.role,
            "created": r.created,
            "created_by": r.created_by,
            "revoked": r.revoked,
        }
        for r in rows
    ]


def revoke_token(engine: Any, token_id: str) -> None:
    table = schema.operator_tokens
    with Transaction(engine) as db:
        done = db.execute(table.update().where(table.c.id == token_id).values(revoked=time.time())).rowcount
    if not done:
        raise UsageError(f"token {token_id!r} not found")
