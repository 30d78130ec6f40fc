"""Capture files in chunks (issue 41): the chunks of a file still arriving, until it is whole.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 05:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "capture_parts",
        sa.Column("device_id", sa.String(length=64), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("received", sa.Float(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", "sha256", "idx"),
    )
    op.create_index("ix_capture_parts_received", "capture_parts", ["received"])


def downgrade() -> None:
    op.drop_index("ix_capture_parts_received", table_name="capture_parts")
    op.drop_table("capture_parts")
