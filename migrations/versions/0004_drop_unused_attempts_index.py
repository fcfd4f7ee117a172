"""drop ix_attempts_open: no query reads it, and every attempt written paid for it

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

The index on (device_id, ended_at) was made for a lookup of open attempts per device that the
engine does in memory; no query filters on `ended_at`. Each attempt inserted and each attempt
ended updated it: one more B-tree page in the WAL (SQLite) or index entry (Postgres) on the
engine's hot path. Device attempt lists use `ix_attempts_device` (device_id, started_at).
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.drop_index("ix_attempts_open")


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch_op:
        batch_op.create_index("ix_attempts_open", ["device_id", "ended_at"], unique=False)
