"""The database blob store: artifact bytes in `artifact_chunks` rows, for replicated deployments
(SPEC section 7: Postgres is the only truth, so every replica can take a piece and serve a blob).

An upload's pieces are rows `(upload_id, start_byte, size, data)`; a piece goes in only if its
`start_byte` is where the staged bytes end, in the same statement, and the primary key refuses a
second piece at one offset, so a retry racing its original on another replica cannot stage bytes
twice. Promoting is one insert into `artifact_blobs` (sha256 -> the upload whose chunks hold it):
no bytes are copied, and a blob stored already keeps its chunks while the twin's are dropped.
Reads take one chunk row at a time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from sqlalchemy import func, select

from orchestrator.artifacts import sql
from orchestrator.artifacts.errors import ArtifactNotFound, IntegrityFailed, OffsetMismatch
from orchestrator.engine.times import utc
from orchestrator.store.models import ArtifactBlob, ArtifactChunk
from orchestrator.store.repo import Store, WriteConflict

_APPEND = (
    "INSERT INTO artifact_chunks (upload_id, start_byte, size, data) SELECT :upload_id, :start, :size, :data "
    "WHERE (SELECT coalesce(max(start_byte + size), 0) FROM artifact_chunks WHERE upload_id = :upload_id) = :start "
    "RETURNING start_byte"
)
_PROMOTE = (
    "INSERT INTO artifact_blobs (sha256, size, upload_id, created_at) VALUES (:sha256, :size, :upload_id, :now) "
    "ON CONFLICT (sha256) DO NOTHING RETURNING upload_id"
)
# Never the chunks a blob was promoted from: those are the blob.
_DISCARD = (
    "DELETE FROM artifact_chunks WHERE upload_id = :upload_id "
    "AND NOT EXISTS (SELECT 1 FROM artifact_blobs WHERE artifact_blobs.upload_id = :upload_id)"
)


class DatabaseBlobs:
    kind = "database"

    def __init__(self, store: Store) -> None:
        self.store = store

    async def staged(self, upload_id: str) -> int:
        q = select(func.coalesce(func.max(ArtifactChunk.start_byte + ArtifactChunk.size), 0)).where(
            ArtifactChunk.upload_id == upload_id
        )
        async with self.store.sessions() as s:
            return int((await s.execute(q)).scalar_one())

    async def append(self, upload_id: str, start: int, data: bytes) -> int:
        try:
            done = await sql.write(self.store, _APPEND, upload_id=upload_id, start=start, size=len(data), data=data)
        except WriteConflict:
            done = []  # another copy of this piece won the race
        if not done:
            raise OffsetMismatch.at(await self.staged(upload_id), start)
        return start + len(data)

    def read_staged(self, upload_id: str, start: int, end: int) -> AsyncIterator[bytes]:
        return self._chunks(upload_id, start, end, f"upload {upload_id}")

    async def promote(self, upload_id: str, sha256: str, size: int) -> None:
        won = await sql.write(self.store, _PROMOTE, sha256=sha256, size=size, upload_id=upload_id, now=utc(time.time()))
        if not won:
            await self.discard(upload_id)  # the blob is stored already (the first twin's chunks)

    async def discard(self, upload_id: str) -> None:
        await sql.write(self.store, _DISCARD, upload_id=upload_id)

    async def has(self, sha256: str) -> bool:
        return await self._source(sha256) is not None

    async def _source(self, sha256: str) -> str | None:
        async with self.store.sessions() as s:
            return await s.scalar(select(ArtifactBlob.upload_id).where(ArtifactBlob.sha256 == sha256))

    async def read(self, sha256: str, start: int, end: int) -> AsyncIterator[bytes]:
        source = await self._source(sha256)
        if source is None:
            raise ArtifactNotFound(f"the blob {sha256} is missing from the artifact store")
        async for piece in self._chunks(source, start, end, f"blob {sha256}"):
            yield piece

    async def _chunks(self, upload_id: str, start: int, end: int, what: str) -> AsyncIterator[bytes]:
        """Chunk rows from the one holding `start`, each cut to `[start, end)`, one query per chunk."""
        first = (
            select(ArtifactChunk.start_byte)
            .where(ArtifactChunk.upload_id == upload_id, ArtifactChunk.start_byte <= start)
            .order_by(ArtifactChunk.start_byte.desc())
            .limit(1)
        )
        async with self.store.sessions() as s:
            at = await s.scalar(first)
        position = start
        while position < end:
            if at is None:
                raise IntegrityFailed(f"the {what} is shorter than recorded ({position} of {end} bytes)")
            async with self.store.sessions() as s:
                row = (
                    await s.execute(
                        select(ArtifactChunk.data).where(
                            ArtifactChunk.upload_id == upload_id, ArtifactChunk.start_byte == at
                        )
                    )
                ).first()
            if row is None:
                raise IntegrityFailed(f"the {what} is missing the bytes from {at} on")
            data: bytes = row[0]
            piece = data[position - at : end - at]
            if not piece:
                raise IntegrityFailed(f"the {what} is shorter than recorded ({position} of {end} bytes)")
            yield piece
            at += len(data)
            position += len(piece)
