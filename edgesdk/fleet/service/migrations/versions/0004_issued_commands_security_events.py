"""Refusals cannot be forged: every issued command's digest (``issued_commands``), so a device's
refusal counts only when it is of a command issued to it, and the refusals that do not count
(``security_events``; docs/security.md, "Forged refusals").

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05 16:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "issued_commands",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("deployment_id", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("targets", sa.Text(), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("issued", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )
    with op.batch_alter_table("issued_commands", schema=None) as batch_op:
        batch_op.create_index("ix_issued_commands_deployment", ["deployment_id"], unique=False)
    op.create_table(
        "security_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("device_id", sa.String(length=64), nullable=False),
        sa.Column("msg_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("deployment_id", sa.String(length=64), nullable=True),
        sa.Column("command_sha256", sa.String(length=64), nullable=True),
        sa.Column("why", sa.String(length=32), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("device_id", "msg_id", name="uq_security_events_msg"),
    )
    with op.batch_alter_table("security_events", schema=None) as batch_op:
        batch_op.create_index("ix_security_events_ts", ["ts"], unique=False)
        batch_op.create_index("ix_security_events_deployment", ["deployment_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("security_events", schema=None) as batch_op:
        batch_op.drop_index("ix_security_events_deployment")
        batch_op.drop_index("ix_security_events_ts")
    op.drop_table("security_events")
    with op.batch_alter_table("issued_commands", schema=None) as batch_op:
        batch_op.drop_index("ix_issued_commands_deployment")
    op.drop_table("issued_commands")
