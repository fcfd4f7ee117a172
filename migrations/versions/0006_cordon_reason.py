"""cordon reason: why a device is cordoned (an operator, or a safety budget it breached)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

Safety budgets: a device whose agent reports a breached safety budget is cordoned by
the engine, and operators (REST `cordon_reason`, the dashboard) must see why.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("cordon_reason", sa.String(length=300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("cordon_reason")
