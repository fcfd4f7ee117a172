"""device catalogue version: a counter of the changes submission checks look at

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05

`device_catalog.version` (one row) grows with every committed change to the devices that a
submission's checks read: a row made or removed, or a change of its name, labels, reported
labels, platform, tools, admin state, liveness, cordon or controls. Changes of the columns the
engine writes at every dispatch (fence, current batch, last seen, session epoch) do not count.
A replica away from the engine keeps its copy of the fleet and reads the devices again only when
the version moved: one small read per submission instead of every device row.

The count is taken by a deferred constraint trigger, at commit: a transaction locks the one
row last, after every other row it touches, so two transactions never wait on each other through
it (no deadlock), and a reader never sees the new version before the change is committed.
Postgres only, as replicas are: on SQLite (one process, whose checks read the engine's memory)
the table is made but no trigger, so the engine's writes there pay nothing for it, and a
replica on SQLite reads every row (`Store.device_catalog_version` is None there). Expand only: a
replica of the previous revision writes devices as before, and the triggers count its changes
too.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# The columns whose changes count (what `device_from_row` reads, less the engine's bookkeeping).
WATCHED = (
    "name",
    "labels",
    "reported_labels",
    "platform",
    "tools",
    "admin_state",
    "liveness",
    "cordon_reason",
    "control",
)

_PG_FUNCTION = """
CREATE FUNCTION device_catalog_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE device_catalog SET version = version + 1 WHERE id = 1;
    RETURN NULL;
END
$$
"""


def _pg_changed() -> str:
    # json has no equality operator: its text is compared (a change of spelling alone counts too).
    return " OR ".join(f"OLD.{c}::text IS DISTINCT FROM NEW.{c}::text" for c in WATCHED)


def upgrade() -> None:
    op.create_table(
        "device_catalog",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute("INSERT INTO device_catalog (id, version) VALUES (1, 0)")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        for name, event, when in (
            ("device_catalog_rows", "INSERT OR DELETE", ""),
            ("device_catalog_changes", "UPDATE", f" WHEN ({_pg_changed()})"),
        ):
            op.execute(
                f"CREATE CONSTRAINT TRIGGER {name} AFTER {event} ON devices DEFERRABLE INITIALLY DEFERRED"
                f" FOR EACH ROW{when} EXECUTE PROCEDURE device_catalog_bump()"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER device_catalog_rows ON devices")
        op.execute("DROP TRIGGER device_catalog_changes ON devices")
        op.execute("DROP FUNCTION device_catalog_bump()")
    op.drop_table("device_catalog")
