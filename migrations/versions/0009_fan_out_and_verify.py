"""fan out and verify (placeholder)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

Issue 20, fan-out nodes and verified outcomes (filled in by that work).
"""

from __future__ import annotations

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
