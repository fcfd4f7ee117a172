"""artifacts: files published by commands, their uploads, and the database blob store

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

`artifacts` holds every published version of a task's artifacts; `artifact_uploads` the uploads
on their way in (resumable). `artifact_blobs` and `artifact_chunks` are the blob store of a
deployment on Postgres (every replica can serve them); with SQLite the blobs are files under the
data dir and these two tables stay empty.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifact_uploads",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("task_id", sa.String(length=40), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("batch_id", sa.String(length=40), nullable=False),
        sa.Column("device_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.String(length=300), nullable=True),
        sa.Column("artifact_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_artifact_uploads_batch", "artifact_uploads", ["batch_id", "name"], unique=False)
    op.create_index("ix_artifact_uploads_state", "artifact_uploads", ["state", "created_at"], unique=False)
    op.create_table(
        "artifacts",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("task_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("batch_id", sa.String(length=40), nullable=False),
        sa.Column("device_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("uq_artifacts_version", "artifacts", ["task_id", "name", "version"], unique=True)
    op.create_table(
        "artifact_blobs",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("upload_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sha256"),
    )
    op.create_table(
        "artifact_chunks",
        sa.Column("upload_id", sa.String(length=40), nullable=False),
        sa.Column("start_byte", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("upload_id", "start_byte"),
    )


def downgrade() -> None:
    op.drop_table("artifact_chunks")
    op.drop_table("artifact_blobs")
    op.drop_index("uq_artifacts_version", table_name="artifacts")
    op.drop_table("artifacts")
    op.drop_index("ix_artifact_uploads_state", table_name="artifact_uploads")
    op.drop_index("ix_artifact_uploads_batch", table_name="artifact_uploads")
    op.drop_table("artifact_uploads")
