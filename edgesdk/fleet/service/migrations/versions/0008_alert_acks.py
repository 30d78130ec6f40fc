"""Acknowledged alerts: who acknowledged which occurrence of an alert, and when (issue 40:
an abort by hand no longer stays red for ever on the dashboard).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_acks",
        sa.Column("alert_key", sa.String(length=255), nullable=False),
        sa.Column("acked_by", sa.String(length=128), nullable=False),
        sa.Column("acked_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("alert_key"),
    )


def downgrade() -> None:
    op.drop_table("alert_acks")
