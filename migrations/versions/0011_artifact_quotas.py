"""artifact quotas: bytes and uploads counted per task and per device

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

`artifact_usage` counts, per task and per device, the declared bytes and the number of uploads
that hold a reservation (`artifact_uploads.counted`): opening an upload reserves its size in the
same transaction that records it, and a failed upload, or one that recorded nothing new, gives it
back. Artifacts recorded before this revision are counted from `artifacts`; uploads open at the
upgrade hold no reservation (they complete or fail as before, uncounted).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifact_usage",
        sa.Column("scope", sa.String(length=10), nullable=False),
        sa.Column("owner_id", sa.String(length=40), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("scope", "owner_id"),
    )
    with op.batch_alter_table("artifact_uploads") as batch:
        batch.add_column(sa.Column("counted", sa.Boolean(), server_default=sa.false(), nullable=False))
    for scope, column in (("task", "task_id"), ("device", "device_id")):
        op.execute(
            f"INSERT INTO artifact_usage (scope, owner_id, bytes, count) "
            f"SELECT '{scope}', {column}, sum(size), count(*) FROM artifacts GROUP BY {column}"
        )


def downgrade() -> None:
    with op.batch_alter_table("artifact_uploads") as batch:
        batch.drop_column("counted")
    op.drop_table("artifact_usage")
