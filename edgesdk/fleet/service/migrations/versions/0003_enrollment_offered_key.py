"""Enrollment requests keep the key first requested: another key announced for the same device
is recorded beside it (``offered_*``) instead of overwriting it, so an approval that names the
first key's id can never approve the second (docs/security.md, "enrollment").

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05 16:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("enrollment_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("offered_public_key", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("offered_key_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("offered_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("enrollment_requests", schema=None) as batch_op:
        batch_op.drop_column("offered_at")
        batch_op.drop_column("offered_key_id")
        batch_op.drop_column("offered_public_key")
