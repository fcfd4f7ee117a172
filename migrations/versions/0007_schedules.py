"""schedules (placeholder)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

Issue 20, schedules: cron schedules that submit a task per tick (filled in by the schedules work).
"""

from __future__ import annotations

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
