"""Artifacts and uploads in the store: who may upload, what was recorded, what a task has.

Writes are conditional statements (`orchestrator.artifacts.sql`): an upload is opened, and an
artifact recorded, only `FROM attempts WHERE batch_id = ... AND device_id = ... AND ended_at IS
NULL`, so the check that a batch is the device's own and still open and the write are one atomic
step on either backend, whichever replica serves the request. Opening an upload also reserves its
bytes against the task's and the device's quotas in the same transaction, and ending one gives
them back in its transaction (`orchestrator.artifacts.quota`).

One exception, as narrow as it can be: a screen recording (`recording-....webm`) is made from the
frames once the orchestrator has told the device its attempt ended and that it keeps it, so its
upload is taken for an attempt that ended within `LATE_RECORDING_S`, and only for it. The
device's own batch still; the quotas still count it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, exists, select
from sqlalchemy.orm import aliased

from orchestrator.artifacts import quota, sql
from orchestrator.artifacts.errors import BatchClosed, NotYourBatch, QuotaExceeded
from orchestrator.artifacts.model import ArtifactId, ArtifactRecord, Sha256, UploadState
from orchestrator.ids import new_id
from orchestrator.store.models import Artifact, ArtifactUpload, ArtifactUsage, Attempt
from orchestrator.store.repo import Store, WriteConflict, decode_cursor, encode_cursor

LATE_RECORDING_S = 3600.0  # a recording is uploaded after its attempt ended, within this
RECORDING_NAME = re.compile(r"recording-[^/]{1,180}\.webm")
RECORD_TRIES = 5  # two replicas recording the same name at once: one retries with the next version
ABANDONED_PER_SWEEP = 20

_OPEN_UPLOAD = (
    "INSERT INTO artifact_uploads (id, task_id, node_id, batch_id, device_id, name, size, sha256, state, "
    "created_at, updated_at, counted) SELECT :id, a.task_id, a.node_id, a.batch_id, a.device_id, :name, :size, "
    ":sha256, 'open', :now, :now, true FROM attempts a WHERE a.batch_id = :batch_id AND a.device_id = :device_id "
    "AND a.task_id = :task_id AND (a.ended_at IS NULL OR (:late AND a.ended_at > :since)) RETURNING id"
)
_RECORD = (
    "INSERT INTO artifacts (id, task_id, name, version, sha256, size, node_id, batch_id, device_id, created_at) "
    "SELECT :id, a.task_id, :name, (SELECT coalesce(max(x.version), 0) + 1 FROM artifacts x "
    "WHERE x.task_id = a.task_id AND x.name = :name), :sha256, :size, a.node_id, a.batch_id, a.device_id, :now "
    "FROM attempts a WHERE a.batch_id = :batch_id AND a.device_id = :device_id "
    "AND (a.ended_at IS NULL OR (:late AND a.ended_at > :since)) RETURNING version"
)
_END_UPLOAD = (
    "UPDATE artifact_uploads SET state = :state, artifact_id = :artifact_id, reason = :reason, updated_at = :now "
    "WHERE id = :id AND state = 'open' RETURNING id"
)


@dataclass(frozen=True)
class BatchOwner:
    """Whose batch it is, and whether its attempt is still open."""

    device_id: str
    task_id: str
    node_id: str
    open: bool
    ended_at: datetime | None = None


async def batch_owner(store: Store, batch_id: str) -> BatchOwner | None:
    q = select(Attempt.device_id, Attempt.task_id, Attempt.node_id, Attempt.ended_at).where(
        Attempt.batch_id == batch_id
    )
    async with store.sessions() as s:
        row = (await s.execute(q)).first()
    return None if row is None else BatchOwner(row[0], row[1], row[2], row[3] is None, row[3])


def late(name: str) -> bool:
    """Whether an artifact of this name may be uploaded after its attempt ended (a recording)."""
    return RECORDING_NAME.fullmatch(name) is not None


def late_since(now: datetime) -> datetime:
    return now - timedelta(seconds=LATE_RECORDING_S)


def still_late(name: str, owner: BatchOwner, now: datetime) -> bool:
    """Whether a recording (`name`) of this ended batch is still within its late window."""
    if not late(name) or owner.ended_at is None:
        return False
    ended = owner.ended_at if owner.ended_at.tzinfo else owner.ended_at.replace(tzinfo=now.tzinfo)
    return ended > late_since(now)


async def open_batch(
    store: Store, device_id: str, batch_id: str, verb: str, name: str = "", now: datetime | None = None
) -> BatchOwner:
    """The batch, if it is `device_id`'s own and still open (`NotYourBatch`, `BatchClosed`);
    `verb` (publish, fetch) says what the device asked to do, for the refusal. A recording
    (`name`) may be published for a batch that ended within `LATE_RECORDING_S` of `now`."""
    owner = await batch_owner(store, batch_id)
    if owner is None or owner.device_id != device_id:
        raise NotYourBatch(
            f"batch {batch_id} was not sent to this device; a device may {verb} only for the batch it runs"
        )
    if not owner.open and now is not None and still_late(name, owner, now):
        return owner
    if not owner.open:
        raise BatchClosed(f"batch {batch_id} has ended; a device may {verb} only for a batch that still runs")
    return owner


async def open_upload(
    store: Store,
    owner: BatchOwner,
    batch_id: str,
    name: str,
    size: int,
    sha256: Sha256,
    now: datetime,
    limits: quota.Quota,
) -> ArtifactUpload:
    """A new upload for an open batch of the owner's device, its bytes reserved against the
    task's and the device's quotas in the same transaction (`QuotaExceeded`, `BatchClosed` if
    the batch has just ended)."""
    limits.check_alone(name, size, owner.task_id, owner.device_id)
    upload_id = new_id("upl")
    params = {
        "id": upload_id,
        "name": name,
        "size": size,
        "sha256": sha256,
        "now": now,
        "batch_id": batch_id,
        "device_id": owner.device_id,
        "task_id": owner.task_id,
        "late": late(name),
        "since": late_since(now),
    }
    reserve = limits.reserve(owner.task_id, owner.device_id, size)
    try:
        await sql.transaction(store, [*reserve, sql.Step(_OPEN_UPLOAD, params)])
    except sql.Stopped as stop:
        if stop.index == len(reserve):
            raise BatchClosed(f"batch {batch_id} has ended: nothing more can be published for it") from None
        scope, owner_id = ("task", owner.task_id) if stop.index == 0 else ("device", owner.device_id)
        raise await _over(store, limits, scope, owner_id, name, size) from None
    row = await get_upload(store, upload_id)
    assert row is not None
    return row


async def get_upload(store: Store, upload_id: str) -> ArtifactUpload | None:
    async with store.sessions() as s:
        return await s.get(ArtifactUpload, upload_id)


async def find_open_upload(store: Store, batch_id: str, name: str, size: int, sha256: str) -> ArtifactUpload | None:
    """The batch's open upload of exactly this file, if a publish is being asked again."""
    q = (
        select(ArtifactUpload)
        .where(
            ArtifactUpload.batch_id == batch_id,
            ArtifactUpload.name == name,
            ArtifactUpload.size == size,
            ArtifactUpload.sha256 == sha256,
            ArtifactUpload.state == UploadState.OPEN.value,
        )
        .order_by(ArtifactUpload.created_at.desc())
        .limit(1)
    )
    async with store.sessions() as s:
        return await s.scalar(q)


async def _over(store: Store, limits: quota.Quota, scope: str, owner_id: str, name: str, size: int) -> QuotaExceeded:
    """Which of the scope's quotas (bytes or uploads) refused, with its usage, for the message."""
    used_bytes, used_count = await usage(store, scope, owner_id)
    max_bytes, max_count = limits.limits(scope)
    if used_count + 1 > max_count:
        return quota.exceeded(name, size, scope, owner_id, "count", max_count, used_count)
    return quota.exceeded(name, size, scope, owner_id, "bytes", max_bytes, used_bytes)


async def end_upload(
    store: Store,
    upload_id: str,
    state: UploadState,
    now: datetime,
    artifact_id: str | None = None,
    reason: str | None = None,
    give_back: bool = False,
) -> bool:
    """Close an open upload as complete (with its artifact) or failed (with why), and with
    `give_back` return its quota reservation in the same transaction; False if it was closed
    already (then nothing is given back: a reservation is returned once)."""
    params = {
        "state": state.value,
        "artifact_id": artifact_id,
        "reason": reason[:300] if reason else None,
        "now": now,
        "id": upload_id,
    }
    try:
        await sql.transaction(store, [sql.Step(_END_UPLOAD, params), *(quota.release(upload_id) if give_back else [])])
    except sql.Stopped:
        return False
    return True


async def abandoned_uploads(store: Store, now: datetime) -> list[str]:
    """Open uploads whose batch has ended: nobody can finish them, so their bytes can go (a
    recording's, once its late window has passed)."""
    recording = and_(ArtifactUpload.name.like("recording-%.webm"), Attempt.ended_at > late_since(now))
    q = (
        select(ArtifactUpload.id)
        .join(Attempt, Attempt.batch_id == ArtifactUpload.batch_id)
        .where(ArtifactUpload.state == UploadState.OPEN.value, Attempt.ended_at.is_not(None), ~recording)
        .limit(ABANDONED_PER_SWEEP)
    )
    async with store.sessions() as s:
        return [str(r) for r in (await s.execute(q)).scalars()]


async def record(store: Store, upload: ArtifactUpload, now: datetime) -> tuple[ArtifactRecord, bool]:
    """Record the upload's content as its task's artifact `name`: a new version, or, when the
    newest version has this very content, that version (publishing again changes nothing); and
    whether it is new. The batch must still be open (`BatchClosed`)."""
    for _ in range(RECORD_TRIES):
        same = await newest(store, upload.task_id, upload.name)
        if same is not None and same.sha256 == upload.sha256:
            return same, False
        artifact_id = new_id("art")
        try:
            made = await sql.write(
                store,
                _RECORD,
                id=artifact_id,
                name=upload.name,
                sha256=upload.sha256,
                size=upload.size,
                now=now,
                batch_id=upload.batch_id,
                device_id=upload.device_id,
                late=late(upload.name),
                since=late_since(now),
            )
        except WriteConflict:
            continue  # someone recorded this name meanwhile: look again
        if not made:
            raise BatchClosed(f"batch {upload.batch_id} has ended: its artifact {upload.name!r} was not recorded")
        found = await by_id(store, upload.task_id, artifact_id)
        assert found is not None
        return found, True
    raise WriteConflict(f"artifact {upload.name!r} of task {upload.task_id} kept changing; publish it again")


def _record(row: Artifact) -> ArtifactRecord:
    return ArtifactRecord(
        id=ArtifactId(row.id),
        task_id=row.task_id,
        name=row.name,
        version=row.version,
        sha256=Sha256(row.sha256),
        size=row.size,
        node_id=row.node_id,
        batch_id=row.batch_id,
        device_id=row.device_id,
        created_at=row.created_at,
    )


async def by_id(store: Store, task_id: str, artifact_id: str) -> ArtifactRecord | None:
    async with store.sessions() as s:
        row = await s.get(Artifact, artifact_id)
    return _record(row) if row is not None and row.task_id == task_id else None


async def usage(store: Store, scope: str, owner_id: str) -> tuple[int, int]:
    """(bytes, uploads) counted against the quota of a task or a device (`scope`)."""
    async with store.sessions() as s:
        row = await s.get(ArtifactUsage, (scope, owner_id))
    return (row.bytes, row.count) if row is not None else (0, 0)


async def newest(
    store: Store, task_id: str, name: str | None, sha256: str | None = None, version: int | None = None
) -> ArtifactRecord | None:
    """The newest version of the task's artifact `name` (or of any name) matching what is given."""
    q = select(Artifact).where(Artifact.task_id == task_id)
    if name is not None:
        q = q.where(Artifact.name == name)
    if sha256 is not None:
        q = q.where(Artifact.sha256 == sha256)
    if version is not None:
        q = q.where(Artifact.version == version)
    q = q.order_by(Artifact.created_at.desc(), Artifact.version.desc()).limit(1)
    async with store.sessions() as s:
        row = await s.scalar(q)
    return _record(row) if row is not None else None


async def page(
    store: Store, task_id: str, history: bool, limit: int, cursor: str | None
) -> tuple[list[tuple[ArtifactRecord, bool]], str | None]:
    """The task's artifacts, newest first, each with whether it is its name's newest version;
    without `history` only those. Keyset-paginated on (created_at, id)."""
    later = aliased(Artifact)
    superseded = exists().where(
        and_(later.task_id == Artifact.task_id, later.name == Artifact.name, later.version > Artifact.version)
    )
    q = (
        select(Artifact, superseded)
        .where(Artifact.task_id == task_id)
        .order_by(Artifact.created_at.desc(), Artifact.id.desc())
        .limit(limit + 1)
    )
    if not history:
        q = q.where(~superseded)
    if cursor:
        at, last = decode_cursor(cursor)
        q = q.where((Artifact.created_at < at) | ((Artifact.created_at == at) & (Artifact.id < last)))
    async with store.sessions() as s:
        rows = [(_record(a), not bool(old)) for a, old in (await s.execute(q)).all()]
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = encode_cursor(rows[-1][0].created_at, rows[-1][0].id) if more and rows else None
    return rows, nxt
