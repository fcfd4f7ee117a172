"""lease holder's session: the Postgres backend that took or renewed a lease

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

`leases.holder_pid` records `pg_backend_pid()` of the session that last took or renewed the
lease. When that session is gone from `pg_stat_activity` (its process died, and Postgres ended
its backend when the kernel closed the socket), another replica may take the lease before it
expires; `leases.renewed_at` says when, so that a session ended by a Postgres restart since
(which ends every session, a living holder's too) does not count. Expand only: nullable
columns, which a replica of the previous revision keeps working beside. Its renewals do not
write them, so on Postgres a trigger keeps the column only
when the session writing the row is the one it names and clears it otherwise: a lease taken or
renewed by an older replica carries no pid (never a dead one left from the holder before it),
and is taken only once it has expired.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_FUNCTION = """
CREATE FUNCTION leases_holder_pid_of_writer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.holder_pid IS DISTINCT FROM pg_backend_pid() THEN
        NEW.holder_pid := NULL;
    END IF;
    RETURN NEW;
END
$$
"""
_TRIGGER = (
    "CREATE TRIGGER leases_holder_pid BEFORE INSERT OR UPDATE ON leases"
    " FOR EACH ROW EXECUTE PROCEDURE leases_holder_pid_of_writer()"
)


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("holder_pid", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_FUNCTION)
        op.execute(_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER leases_holder_pid ON leases")
        op.execute("DROP FUNCTION leases_holder_pid_of_writer()")
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("renewed_at")
        batch.drop_column("holder_pid")
