"""first contact: reusable device names, device history, re-runs

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

NOT_REVOKED = sa.text("admin_state != 'revoked'")


def _devices(unique_name: bool) -> sa.Table:
    """The devices table as 0002 left it, with or without its table-wide unique name (SQLite
    cannot drop an unnamed constraint, so the batch copies the table from this shape)."""
    return sa.Table(
        "devices",
        sa.MetaData(),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("reported_labels", sa.JSON(), nullable=False),
        sa.Column("platform", sa.String(length=20), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("tools", sa.JSON(), nullable=False),
        sa.Column("admin_state", sa.String(length=20), nullable=False),
        sa.Column("liveness", sa.String(length=20), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("current_batch_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=True),
        sa.Column("session_epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id"),
        *([sa.UniqueConstraint("name")] if unique_name else []),
        sa.UniqueConstraint("token_hash"),
    )


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table("devices", copy_from=_devices(unique_name=False), recreate="always"):
            pass
    else:
        op.drop_constraint("devices_name_key", "devices", type_="unique")
    op.create_index(
        "uq_devices_active_name",
        "devices",
        ["name"],
        unique=True,
        sqlite_where=NOT_REVOKED,
        postgresql_where=NOT_REVOKED,
    )
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("rerun_of", sa.String(length=40), nullable=True))
        batch.create_index("ix_tasks_name", ["name", "created_at"], unique=False)
    with op.batch_alter_table("attempts") as batch:
        batch.create_index("ix_attempts_device", ["device_id", "started_at"], unique=False)
    op.create_table(
        "device_history",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("device_id", sa.String(length=40), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.String(length=300), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_device_history_device", "device_history", ["device_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_device_history_device", table_name="device_history")
    op.drop_table("device_history")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_index("ix_attempts_device")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_index("ix_tasks_name")
        batch.drop_column("rerun_of")
    op.drop_index("uq_devices_active_name", table_name="devices")
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table("devices", copy_from=_devices(unique_name=True), recreate="always"):
            pass
    else:
        op.create_unique_constraint("devices_name_key", "devices", ["name"])
