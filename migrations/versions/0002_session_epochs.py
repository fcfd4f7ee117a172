"""session epochs and the store's identity

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("session_epoch", sa.BigInteger(), server_default="0", nullable=False))
    meta = op.create_table(
        "server_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.bulk_insert(meta, [{"key": "server_id", "value": "srv_" + secrets.token_hex(12)}])


def downgrade() -> None:
    op.drop_table("server_meta")
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("session_epoch")
