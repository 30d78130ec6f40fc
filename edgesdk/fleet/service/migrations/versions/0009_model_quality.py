"""Model quality (issue 41): each telemetry report's drift scores and data-quality counts per
model (``model_quality``, kept like raw telemetry) and their running totals per device and model
(``model_quality_totals``, the Prometheus counters).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 22:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_quality",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("device_id", sa.String(length=64), nullable=False),
        sa.Column("msg_id", sa.String(length=64), nullable=False),
        sa.Column("model_name", sa.String(length=128), nullable=False),
        sa.Column("model_release", sa.Integer(), nullable=True),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("window_s", sa.Float(), nullable=False),
        sa.Column("reference", sa.Boolean(), nullable=False),
        sa.Column("scores", sa.Text(), nullable=False),
        sa.Column("worst_psi", sa.Float(), nullable=True),
        sa.Column("nonfinite", sa.Integer(), nullable=False),
        sa.Column("out_of_range", sa.Integer(), nullable=False),
        sa.Column("constant", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("device_id", "msg_id", "model_name", name="uq_model_quality_msg"),
    )
    op.create_index("ix_model_quality_device_model_ts", "model_quality", ["device_id", "model_name", "ts"])
    op.create_index("ix_model_quality_ts", "model_quality", ["ts"])
    op.create_table(
        "model_quality_totals",
        sa.Column("device_id", sa.String(length=64), nullable=False),
        sa.Column("model_name", sa.String(length=128), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("nonfinite", sa.BigInteger(), nullable=False),
        sa.Column("out_of_range", sa.BigInteger(), nullable=False),
        sa.Column("constant", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", "model_name"),
    )


def downgrade() -> None:
    op.drop_table("model_quality_totals")
    op.drop_index("ix_model_quality_ts", table_name="model_quality")
    op.drop_index("ix_model_quality_device_model_ts", table_name="model_quality")
    op.drop_table("model_quality")
