"""approvals: commands waiting for a person's decision, and the decisions

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
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
        "approvals",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.String(length=40), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("batch_id", sa.String(length=40), nullable=False),
        sa.Column("call_id", sa.String(length=200), nullable=False),
        sa.Column("device_id", sa.String(length=40), nullable=False),
        sa.Column("tool", sa.String(length=200), nullable=False),
        sa.Column("arguments", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("local_only", sa.Boolean(), nullable=False),
        sa.Column("screenshot", sa.Text(), nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_by", sa.String(length=200), nullable=True),
        sa.Column("decision_reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_approvals_state", "approvals", ["state", "created_at", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_approvals_state", table_name="approvals")
    op.drop_table("approvals")
