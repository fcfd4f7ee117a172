"""artifacts (placeholder)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

Issue 20, artifacts: content-addressed files published by commands (filled in by the artifacts work).
"""

from __future__ import annotations

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
