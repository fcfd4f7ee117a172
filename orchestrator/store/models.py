"""Tables. ORM classes here are the schema only; API schemas and wire models live elsewhere."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, ForeignKey, Index, Integer, String, Text, TypeDecorator, text
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.expression import false
from sqlalchemy.types import LargeBinary  # artifact chunks


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite hands back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(JSON(none_as_null=True), "postgresql")


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON, Any: JSON}


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    role: Mapped[str] = mapped_column(String(20))
    key_hash: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


# A device name belongs to at most one device that is not revoked: a revoked device keeps its
# name in the records, and the name may be enrolled again (a partial unique index, so the
# database itself refuses two concurrent enrollments of one name).
NOT_REVOKED = text("admin_state != 'revoked'")


class Device(Base):
    __tablename__ = "devices"
    __table_args__ = (
        Index("uq_devices_active_name", "name", unique=True, sqlite_where=NOT_REVOKED, postgresql_where=NOT_REVOKED),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # set at enrollment
    reported_labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # from hello
    platform: Mapped[str] = mapped_column(String(20), default="other")
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    tools: Mapped[list[Any]] = mapped_column(JSON, default=list)
    admin_state: Mapped[str] = mapped_column(String(20), default="active")
    liveness: Mapped[str] = mapped_column(String(20), default="enrolled")
    fence: Mapped[int] = mapped_column(BigInteger, default=0)
    # Grows with every connection the device opens, on whichever replica: only the holder of the
    # newest connection speaks for the device (SPEC section 7). Written by the gateways, never
    # by the engine, so the two never overwrite each other.
    session_epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    current_batch_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime]
    last_seen: Mapped[datetime | None]
    # Why it is cordoned (an operator, or a safety budget its agent reported breached); null otherwise.
    cordon_reason: Mapped[str | None] = mapped_column(String(300), default=None)
    # The agent's part of the device's controls, written only by the engine with `admin_state`:
    # {"gen", "stop_reason", "resumed", "budgets_reset", "breach"} (`orchestrator.domain.controls`);
    # null for a device no control ever touched (generation 0).
    control: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class DeviceCatalog(Base):
    """One row: `version` grows with every committed change to what submission checks read of the
    devices (their rows come and go; names, labels, platforms, tools, states, controls). Triggers
    keep it (migration 0013): a replica that validates away from the engine keeps its copy of the
    fleet and reads the devices again only when this moved."""

    __tablename__ = "device_catalog"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger, default=0)


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (Index("ix_tasks_name", "name", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    state: Mapped[str] = mapped_column(String(20), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    request: Mapped[str | None] = mapped_column(Text)
    replan: Mapped[bool] = mapped_column(default=False)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    body_hash: Mapped[str | None] = mapped_column(String(64))
    dag_version: Mapped[int] = mapped_column(Integer, default=1)
    replans_used: Mapped[int] = mapped_column(Integer, default=0)
    llm_calls: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(index=True)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    rerun_of: Mapped[str | None] = mapped_column(String(40))  # the task this one runs again


class Node(Base):
    __tablename__ = "nodes"

    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(10))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(20))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    output: Mapped[Any | None] = mapped_column(JSON)
    results: Mapped[list[Any] | None] = mapped_column(JSON)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    ready_since: Mapped[datetime | None]
    not_before: Mapped[datetime | None]
    queued_on: Mapped[str | None] = mapped_column(String(40))
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # A fan-out node's rollout ({devices, left_out}; its children are NodeChild rows),
    # and how its verify commands are deciding or decided its outcome.
    fan_out: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    verification: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class NodeChild(Base):
    """A fan-out node's child on one device (the node pinned there). Its attempts are
    the node's attempts on that device."""

    __tablename__ = "node_children"

    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    device_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    device_name: Mapped[str] = mapped_column(String(200))
    position: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(20))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    output: Mapped[Any | None] = mapped_column(JSON)
    results: Mapped[list[Any] | None] = mapped_column(JSON)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    verification: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    ready_since: Mapped[datetime | None]
    not_before: Mapped[datetime | None]
    queued_on: Mapped[str | None] = mapped_column(String(40))
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class Edge(Base):
    __tablename__ = "edges"

    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    source: Mapped[str] = mapped_column(String(64), primary_key=True)
    target: Mapped[str] = mapped_column(String(64), primary_key=True)
    on: Mapped[str] = mapped_column(String(10), default="success")


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        Index("ix_attempts_node", "task_id", "node_id"),
        Index("ix_attempts_device", "device_id", "started_at"),
    )

    batch_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    parent_batch_id: Mapped[str | None] = mapped_column(String(40))  # an agent node's step batches
    kind: Mapped[str] = mapped_column(String(10), default="tool")
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    node_id: Mapped[str] = mapped_column(String(64))
    n: Mapped[int] = mapped_column(Integer)
    device_id: Mapped[str] = mapped_column(String(40))
    fence: Mapped[int] = mapped_column(BigInteger)
    commands: Mapped[list[Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(20))  # dispatched accepted succeeded failed
    deadline: Mapped[datetime | None]
    started_at: Mapped[datetime]
    accepted_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    results: Mapped[list[Any] | None] = mapped_column(JSON)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    cancel_reason: Mapped[str | None] = mapped_column(String(200))


class Approval(Base):
    """A command waiting for a person's approval, or the decision on it. Written only by the
    engine: inserted when a device asks. The device's ledger is the one arbiter: `state` becomes
    a decision only when the device reports the one that holds there. A decision asked of the
    device (an operator's, the expiry, or `cancelled` once its attempt ended) is `requested_*`
    until the device confirms it (or reports that another decision was made first)."""

    __tablename__ = "approvals"
    __table_args__ = (Index("ix_approvals_state", "state", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    node_id: Mapped[str] = mapped_column(String(64))
    batch_id: Mapped[str] = mapped_column(String(40))
    call_id: Mapped[str] = mapped_column(String(200))
    device_id: Mapped[str] = mapped_column(String(40))
    tool: Mapped[str] = mapped_column(String(200))
    arguments: Mapped[dict[str, Any]] = mapped_column(JSON)
    reason: Mapped[str] = mapped_column(Text, default="")
    local_only: Mapped[bool] = mapped_column(default=False)
    screenshot: Mapped[str | None] = mapped_column(Text)  # PNG, base64
    state: Mapped[str] = mapped_column(String(20))  # pending approved denied expired cancelled
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    decided_at: Mapped[datetime | None]
    decided_by: Mapped[str | None] = mapped_column(String(200))
    decision_reason: Mapped[str | None] = mapped_column(Text)
    requested_state: Mapped[str | None] = mapped_column(String(20))  # approved denied expired cancelled
    requested_by: Mapped[str | None] = mapped_column(String(200))
    requested_reason: Mapped[str | None] = mapped_column(Text)
    requested_at: Mapped[datetime | None]


class Schedule(Base):
    """A cron schedule that submits a task per tick. Written only by the engine leader:
    a tick's task and the schedule's move to its next tick are one commit."""

    __tablename__ = "schedules"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    cron: Mapped[str] = mapped_column(String(200))
    timezone: Mapped[str] = mapped_column(String(64))
    task: Mapped[dict[str, Any]] = mapped_column(JSON)  # the task body submitted at each tick
    overlap: Mapped[str] = mapped_column(String(10))  # skip queue
    starting_deadline_s: Mapped[float]
    max_queued: Mapped[int] = mapped_column(Integer)
    paused: Mapped[bool] = mapped_column(default=False)
    paused_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    next_at: Mapped[datetime | None]  # the next tick the engine fires (null while paused)
    last_tick_at: Mapped[datetime | None]  # the newest tick recorded: ticks only ever grow
    last_task_id: Mapped[str | None] = mapped_column(String(40))
    last_run_at: Mapped[datetime | None]  # the tick of that task


# The ticks waiting for their schedule's previous task: few, read at every engine start.
QUEUED_TICK = text("outcome = 'queued'")


class ScheduleTick(Base):
    """What happened at one tick of a schedule: created (with its task), queued, skipped, missed
    or failed. The newest `schedule_ticks_kept` per schedule are kept."""

    __tablename__ = "schedule_ticks"
    __table_args__ = (
        Index("ix_schedule_ticks_queued", "schedule_id", "at", sqlite_where=QUEUED_TICK, postgresql_where=QUEUED_TICK),
    )

    schedule_id: Mapped[str] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"), primary_key=True)
    at: Mapped[datetime] = mapped_column(primary_key=True)
    outcome: Mapped[str] = mapped_column(String(20))
    task_id: Mapped[str | None] = mapped_column(String(40))
    detail: Mapped[str] = mapped_column(Text, default="")
    recorded_at: Mapped[datetime]


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_task", "task_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(40))
    type: Mapped[str] = mapped_column(String(40))
    node_id: Mapped[str | None] = mapped_column(String(64))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    at: Mapped[datetime]


class DeviceHistory(Base):
    """Every change of a device's visible state (liveness and admin), newest kept per device."""

    __tablename__ = "device_history"
    __table_args__ = (Index("ix_device_history_device", "device_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    device_id: Mapped[str] = mapped_column(String(40))
    state: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str] = mapped_column(String(300), default="")
    at: Mapped[datetime]


class Lease(Base):
    """A named lease with an expiry and a fencing counter (the engine lease of SPEC section 7)."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(80))
    fence: Mapped[int] = mapped_column(BigInteger, default=0)
    expires_at: Mapped[datetime | None]
    # The Postgres backend (`pg_backend_pid()`) of the session that last took or renewed it: once
    # that session is gone the holder is dead, and the lease may be taken before it expires.
    holder_pid: Mapped[int | None] = mapped_column(BigInteger)
    # When that session last took or renewed it: a session gone with a Postgres restart since
    # then says nothing of its holder, whose lease then waits for its expiry.
    renewed_at: Mapped[datetime | None]


class ServerMeta(Base):
    """Facts about this store itself, such as `server_id`: the identity every replica and every
    restart of this deployment shares (agents bind their ledger's fences to it)."""

    __tablename__ = "server_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class LlmCall(Base):
    """One call to the model: what it was shown (secrets removed), what it said, what it cost."""

    __tablename__ = "llm_calls"
    __table_args__ = (Index("ix_llm_calls_task", "task_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(40))
    node_id: Mapped[str | None] = mapped_column(String(64))
    purpose: Mapped[str] = mapped_column(String(20))  # plan, replan, agent
    model: Mapped[str] = mapped_column(String(200), default="")
    messages: Mapped[list[Any]] = mapped_column(JSON)
    reply: Mapped[Any | None] = mapped_column(JSON)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float] = mapped_column(default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime]


class DagEdit(Base):
    """A versioned, validated change to a running task's DAG (re-planning)."""

    __tablename__ = "dag_edits"

    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    edits: Mapped[list[Any]] = mapped_column(JSON)
    at: Mapped[datetime]


# ---- artifacts: files published by commands (orchestrator/artifacts/)


class ArtifactUpload(Base):
    """An artifact on its way in: a device's upload for one of its open batches. Its bytes are
    staged in the blob store under the upload's id (resumable from what is staged) until they
    are all there and their sha256 is the one declared; then the artifact is recorded."""

    __tablename__ = "artifact_uploads"
    __table_args__ = (
        Index("ix_artifact_uploads_batch", "batch_id", "name"),
        Index("ix_artifact_uploads_state", "state", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    node_id: Mapped[str] = mapped_column(String(64))
    batch_id: Mapped[str] = mapped_column(String(40))
    device_id: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(200))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(20))  # open complete failed
    reason: Mapped[str | None] = mapped_column(String(300))  # why it failed
    artifact_id: Mapped[str | None] = mapped_column(String(40))  # the record it made
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    # Its declared bytes count in its task's and device's `artifact_usage` (reserved when it was
    # opened; given back once if it fails or records nothing new).
    counted: Mapped[bool] = mapped_column(default=False, server_default=false())


class Artifact(Base):
    """One published version of a task's artifact `name`: the newest version is the artifact,
    the older ones its history. Content-addressed: the bytes are the blob `sha256`."""

    __tablename__ = "artifacts"
    __table_args__ = (Index("uq_artifacts_version", "task_id", "name", "version", unique=True),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    node_id: Mapped[str] = mapped_column(String(64))
    batch_id: Mapped[str] = mapped_column(String(40))
    device_id: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime]


class ArtifactUsage(Base):
    """Artifact bytes and uploads counted against a quota: one row per task and per device
    (`scope`), changed only by conditional upserts in the transaction that opens or ends an
    upload, so replicas writing at once never go past a quota."""

    __tablename__ = "artifact_usage"

    scope: Mapped[str] = mapped_column(String(10), primary_key=True)  # task | device
    owner_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger)
    count: Mapped[int] = mapped_column(BigInteger)


class ArtifactBlob(Base):
    """The database blob store: which upload's chunks hold the blob `sha256` (blobs are shared
    by every artifact with that content, in any task)."""

    __tablename__ = "artifact_blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    upload_id: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime]


class ArtifactChunk(Base):
    """The database blob store: an upload's bytes in pieces of at most one request body, so
    that every replica can stream them (in and out) without holding a whole blob."""

    __tablename__ = "artifact_chunks"

    upload_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    start_byte: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


__all__ = [
    "ApiKey",
    "Artifact",
    "ArtifactBlob",
    "ArtifactChunk",
    "ArtifactUpload",
    "ArtifactUsage",
    "Attempt",
    "Base",
    "DagEdit",
    "Device",
    "DeviceHistory",
    "Edge",
    "Event",
    "Lease",
    "LlmCall",
    "Node",
    "NodeChild",
    "Schedule",
    "ScheduleTick",
    "ServerMeta",
    "Task",
    "Text",
]
