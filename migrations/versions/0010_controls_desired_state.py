"""controls as desired state: a device's control generation, and decisions asked of a device

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04

A device's controls (emergency stop, resume, budget reset) are desired state with a generation,
written by the engine alone; its agent reports the generation it has applied. An approval's
decision is recorded once the device (its one arbiter) confirms it; what was asked of the device
meanwhile is `requested_*`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("control", sa.JSON(), nullable=True))
    with op.batch_alter_table("approvals") as batch:
        batch.add_column(sa.Column("requested_state", sa.String(length=20), nullable=True))
        batch.add_column(sa.Column("requested_by", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("requested_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("requested_at", sa.DateTime(timezone=True), nullable=True))
    # A device stopped before controls had generations: generation 1 of the same stop, with the
    # reason its history recorded, so its agent is sent the stop again until it reports it applied.
    conn = op.get_bind()
    stopped = conn.execute(sa.text("SELECT id FROM devices WHERE admin_state = 'stopped'")).fetchall()
    for (device_id,) in stopped:
        row = conn.execute(
            sa.text(
                "SELECT reason FROM device_history WHERE device_id = :d AND state = 'stopped' ORDER BY at DESC LIMIT 1"
            ),
            {"d": device_id},
        ).fetchone()
        control = {"gen": 1, "stop_reason": (row[0] if row else "") or ""}
        update = sa.text("UPDATE devices SET control = :c WHERE id = :d").bindparams(sa.bindparam("c", type_=sa.JSON))
        conn.execute(update, {"c": control, "d": device_id})


def downgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("requested_at")
        batch.drop_column("requested_reason")
        batch.drop_column("requested_by")
        batch.drop_column("requested_state")
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("control")
