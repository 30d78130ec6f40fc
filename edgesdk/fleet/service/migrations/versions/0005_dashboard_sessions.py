"""Dashboard sessions: the sign-in cookie holds a random session id mapped here to the operator
token's id (stored as SHA-256, with an expiry), no longer the raw API token (docs/security.md,
"Web surface").

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id_sha256", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=16), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("expires", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id_sha256"),
    )
    op.create_index("ix_dashboard_sessions_token_id", "dashboard_sessions", ["token_id"])
    op.create_index("ix_dashboard_sessions_expires", "dashboard_sessions", ["expires"])


def downgrade() -> None:
    op.drop_index("ix_dashboard_sessions_expires", table_name="dashboard_sessions")
    op.drop_index("ix_dashboard_sessions_token_id", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
