"""fan out and verify: fan-out children, and how verify commands decide a node's outcome

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("fan_out", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("verification", sa.JSON(), nullable=True))
    op.create_table(
        "node_children",
        sa.Column("task_id", sa.String(length=40), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("device_id", sa.String(length=40), nullable=False),
        sa.Column("device_name", sa.String(length=200), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("output", sa.JSON(), nullable=True),
        sa.Column("results", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("verification", sa.JSON(), nullable=True),
        sa.Column("ready_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
        sa.Column("queued_on", sa.String(length=40), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("task_id", "node_id", "device_id"),
    )


def downgrade() -> None:
    op.drop_table("node_children")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("verification")
        batch.drop_column("fan_out")
