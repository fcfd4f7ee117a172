"""schedules: cron schedules that submit a task per tick, and what happened at each tick

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

QUEUED = sa.text("outcome = 'queued'")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("cron", sa.String(length=200), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("task", sa.JSON(), nullable=False),
        sa.Column("overlap", sa.String(length=10), nullable=False),
        sa.Column("starting_deadline_s", sa.Float(), nullable=False),
        sa.Column("max_queued", sa.Integer(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_tick_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_task_id", sa.String(length=40), nullable=True),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "schedule_ticks",
        sa.Column("schedule_id", sa.String(length=40), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("task_id", sa.String(length=40), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["schedule_id"], ["schedules.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("schedule_id", "at"),
    )
    op.create_index(
        "ix_schedule_ticks_queued",
        "schedule_ticks",
        ["schedule_id", "at"],
        unique=False,
        sqlite_where=QUEUED,
        postgresql_where=QUEUED,
    )


def downgrade() -> None:
    op.drop_index("ix_schedule_ticks_queued", table_name="schedule_ticks")
    op.drop_table("schedule_ticks")
    op.drop_table("schedules")
