"""Operator tokens and their roles: who may read, who may change the fleet.

A token is ``esf_<id>_<secret>`` (256 random bits); the database keeps only its SHA-256, so a
copy of the database gives no usable token. Tokens are created on the service's host
(``edgesdk fleet serve token create --role …``) or through the API by an admin, shown once.

Roles are cumulative: a viewer reads; an operator also creates, aborts and rolls back
deployments, uploads bundles and approves enrollment; an admin also revokes devices and
manages tokens.

The dashboard never keeps a token in the browser: signing in makes a **session** — a random id
(256 bits) in the cookie, its SHA-256 in ``dashboard_sessions`` with the token id it stands
for and an expiry. A stolen cookie is worth one session (ended by signing out, by its expiry or
by revoking the token), never an API token.
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
    return identify(engine, token)[0]


def identify(engine: Any, token: str) -> tuple[Operator | None, str]:
    """The operator a token belongs to and "", or None and why not (for the 401's message:
    a malformed, unknown or revoked token). A revoked token's holder learns only that it was."""
    if not token.startswith("esf_") or len(token) > 200:
        return None, "the token is not an operator token (esf_…); create one: edgesdk fleet serve token create"
    table = schema.operator_tokens
    with Transaction(engine) as db:
        row = db.execute(sa.select(table).where(table.c.token_sha256 == _digest(token))).first()
    if row is None or row.role not in ROLES:
        return None, "the token is not known to this fleet service"
    if row.revoked is not None:
        return None, f"token {row.id} was revoked"
    return Operator(token_id=row.id, name=row.name, role=row.role), ""


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


def find_token(engine: Any, token_id: str) -> dict[str, Any] | None:
    """One token's row as ``list_tokens`` shows it, or None."""
    return next((t for t in list_tokens(engine) if t["id"] == token_id), None)


#: How long a dashboard sign-in lasts.
SESSION_TTL_S = 12 * 3600.0


def create_session(engine: Any, token_id: str, *, ttl_s: float = SESSION_TTL_S) -> str:
    """A new dashboard session for the token ``token_id``; returns the session id (the cookie's
    value, shown to nobody else). Expired sessions are swept on the way."""
    session_id = secrets.token_urlsafe(32)
    now = time.time()
    table = schema.dashboard_sessions
    with Transaction(engine) as db:
        db.execute(table.delete().where(table.c.expires < now))
        db.execute(
            table.insert().values(id_sha256=_digest(session_id), token_id=token_id, created=now, expires=now + ttl_s)
        )
    return session_id


def session_operator(engine: Any, session_id: str) -> Operator | None:
    """The operator of a live session: None when unknown, expired, or its token was revoked."""
    if not session_id or len(session_id) > 100:
        return None
    sessions, table = schema.dashboard_sessions, schema.operator_tokens
    with Transaction(engine) as db:
        row = db.execute(
            sa.select(table)
            .join(sessions, sessions.c.token_id == table.c.id)
            .where((sessions.c.id_sha256 == _digest(session_id)) & (sessions.c.expires > time.time()))
        ).first()
    if row is None or row.revoked is not None or row.role not in ROLES:
        return None
    return Operator(token_id=row.id, name=row.name, role=row.role)


def end_session(engine: Any, session_id: str) -> None:
    """Forget a session (signing out); an unknown id is a no-op."""
    table = schema.dashboard_sessions
    with Transaction(engine) as db:
        db.execute(table.delete().where(table.c.id_sha256 == _digest(session_id)))
