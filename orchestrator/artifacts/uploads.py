"""Uploads: a device publishes a file for one of its open batches, resumably, checked by sha256.

1. `open`: the device declares name, size and sha256 for its batch. Refused unless the batch is
   the device's own and open (`NotYourBatch`, `BatchClosed`), the size within the limit
   (`TooLarge`) and within what the task's and the device's quotas have left (`QuotaExceeded`,
   reserved with the upload: `orchestrator.artifacts.quota`). Asking again for the same file in
   the same batch returns the open upload, with what it holds already: a publish retried after a
   lost answer or a restart resumes.
2. `receive`: a piece at `offset`, which must be where the staged bytes end (`OffsetMismatch`
   says where that is). The sha256 is computed as pieces arrive, in this process; if pieces of
   the upload went to another replica or to this one before a restart, the staged bytes are
   hashed again when the last one is in.
3. The piece that completes the upload (or an empty piece at `offset == size`, to finish one
   whose answer was lost; before that it is refused, `UploadIncomplete`) checks the sha256: a
   mismatch fails the upload and drops its bytes (`IntegrityFailed`); a match promotes the bytes
   to their blob and records the artifact. The record is committed before the answer, so a
   device told "complete" has a durable artifact.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any

from orchestrator.artifacts import records
from orchestrator.artifacts.blobs import LOCK_STRIPES, BlobStore
from orchestrator.artifacts.errors import (
    ArtifactNotFound,
    BatchClosed,
    IntegrityFailed,
    InvalidArtifact,
    OffsetMismatch,
    TooLarge,
    UploadFailed,
    UploadIncomplete,
)
from orchestrator.artifacts.model import UploadId, UploadState, UploadView, artifact_name, content_address
from orchestrator.artifacts.quota import Quota
from orchestrator.engine.times import utc
from orchestrator.store.models import ArtifactUpload
from orchestrator.store.repo import Store

HASHES_KEPT = 256  # uploads in progress whose running sha256 this process keeps
SWEEP_EVERY_S = 60.0  # how often an upload's opening looks for abandoned ones to drop


class Uploads:
    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        max_bytes: int,
        chunk_bytes: int,
        clock: Callable[[], float] = time.time,
        quota: Quota | None = None,
    ) -> None:
        self.store = store
        self.quota = quota or Quota()
        self.blobs = blobs
        self.max_bytes = max_bytes
        self.chunk_bytes = chunk_bytes
        self.clock = clock
        self._hashes: OrderedDict[str, tuple[int, Any]] = OrderedDict()  # upload -> (bytes hashed, sha256)
        self._locks = [asyncio.Lock() for _ in range(LOCK_STRIPES)]
        self._swept_at = float("-inf")

    # ---------------------------------------------------------------- the device's requests

    async def open(self, device_id: str, batch_id: str, name: str, size: int, sha256: str) -> UploadView:
        """Open (or find again) the upload of one file for the device's open batch."""
        name = artifact_name(name)
        digest = content_address(sha256)
        if size < 0:
            raise InvalidArtifact(f"size {size} is negative")
        if size > self.max_bytes:
            raise TooLarge(
                f"{name!r} is {size} bytes, over this orchestrator's limit of {self.max_bytes} bytes per artifact "
                "(ORRERY_MAX_ARTIFACT_BYTES); publish a smaller file, e.g. compressed or split"
            )
        owner = await records.open_batch(self.store, device_id, batch_id, "publish", name, self._now())
        await self._sweep()
        row = await records.find_open_upload(self.store, batch_id, name, size, digest)
        if row is None:
            row = await records.open_upload(self.store, owner, batch_id, name, size, digest, self._now(), self.quota)
        return await self._view(row)

    async def status(self, device_id: str, upload_id: str) -> UploadView:
        return await self._view(await self._mine(device_id, upload_id))

    async def receive(self, device_id: str, upload_id: str, offset: int, data: bytes) -> UploadView:
        """Stage one piece at `offset`; the upload's state after it (complete with the artifact
        when that was the last piece)."""
        row = await self._mine(device_id, upload_id)
        if row.state != UploadState.OPEN:  # complete: a piece resent after the answer was lost
            return await self._view(row, refuse=True)
        if offset < 0 or offset + len(data) > row.size:
            raise TooLarge(
                f"a piece of {len(data)} bytes at offset {offset} goes past the {row.size} bytes this upload "
                "declared; send the file's bytes only"
            )
        owner = await records.batch_owner(self.store, row.batch_id)
        if owner is None or not (owner.open or records.still_late(row.name, owner, self._now())):
            await self._fail(row, "its batch ended before all of its bytes arrived")
            raise BatchClosed(f"batch {row.batch_id} has ended: nothing more can be published for it")
        async with self._locks[hash(upload_id) % LOCK_STRIPES]:
            if data:
                end = await self.blobs.append(upload_id, offset, data)
                await self._hashed(upload_id, offset, data)
            else:  # asked to finish
                end = await self.blobs.staged(upload_id)
                if end != offset:
                    raise OffsetMismatch.at(end, offset)
                if end < row.size:
                    raise UploadIncomplete(
                        f"this upload holds {end} of its {row.size} bytes, so it cannot be finished: send the rest "
                        f"from offset {end}",
                        offset=end,
                    )
            if end == row.size:
                return await self._finish(row)
        return UploadView(UploadId(row.id), UploadState.OPEN, end, row.size, self.chunk_bytes)

    # ---------------------------------------------------------------- steps

    async def _mine(self, device_id: str, upload_id: str) -> ArtifactUpload:
        row = await records.get_upload(self.store, upload_id)
        if row is None or row.device_id != device_id:
            raise ArtifactNotFound(f"this device has no upload {upload_id!r}; open one with POST .../uploads")
        return row

    async def _hashed(self, upload_id: str, offset: int, data: bytes) -> None:
        """Carry the running sha256 over a piece staged at `offset` (or forget it if it missed one)."""
        kept = self._hashes.pop(upload_id, None)
        if offset == 0:
            kept = (0, hashlib.sha256())
        if kept is None or kept[0] != offset:
            return  # pieces went elsewhere: the staged bytes are hashed again at the end
        await asyncio.to_thread(kept[1].update, data)
        self._hashes[upload_id] = (offset + len(data), kept[1])
        while len(self._hashes) > HASHES_KEPT:
            self._hashes.popitem(last=False)

    async def _digest(self, row: ArtifactUpload) -> str:
        kept = self._hashes.pop(row.id, None)
        if kept is not None and kept[0] == row.size:
            return str(kept[1].hexdigest())
        digest = hashlib.sha256()
        async for piece in self.blobs.read_staged(row.id, 0, row.size):
            await asyncio.to_thread(digest.update, piece)
        return digest.hexdigest()

    async def _finish(self, row: ArtifactUpload) -> UploadView:
        digest = await self._digest(row)
        if digest != row.sha256:
            await self._fail(row, f"its content has sha256 {digest}, not the declared {row.sha256}")
            raise IntegrityFailed(
                f"the {row.size} bytes received have sha256 {digest}, not the declared {row.sha256}: nothing was "
                "recorded and the upload is dropped; check that the file is not being written to, then publish again",
                sha256=digest,
            )
        await self.blobs.promote(row.id, row.sha256, row.size)
        try:
            artifact, new = await records.record(self.store, row, self._now())
        except BatchClosed:
            await self._fail(row, "its batch ended before the artifact was recorded")
            raise
        # The same content as the name's newest version stores nothing more: its bytes go back.
        await records.end_upload(
            self.store, row.id, UploadState.COMPLETE, self._now(), artifact_id=artifact.id, give_back=not new
        )
        return UploadView(UploadId(row.id), UploadState.COMPLETE, row.size, row.size, self.chunk_bytes, artifact)

    async def _fail(self, row: ArtifactUpload, reason: str) -> None:
        self._hashes.pop(row.id, None)
        await records.end_upload(self.store, row.id, UploadState.FAILED, self._now(), reason=reason, give_back=True)
        await self.blobs.discard(row.id)

    async def _sweep(self) -> None:
        """Drop the staged bytes of uploads nobody can finish any more (their batch ended)."""
        now = self.clock()
        if now - self._swept_at < SWEEP_EVERY_S:
            return
        self._swept_at = now
        for upload_id in await records.abandoned_uploads(self.store, self._now()):
            row = await records.get_upload(self.store, upload_id)
            if row is not None:
                await self._fail(row, "its batch ended before all of its bytes arrived")

    async def _view(self, row: ArtifactUpload, refuse: bool = False) -> UploadView:
        state = UploadState(row.state)
        if state == UploadState.FAILED:
            if refuse:
                raise UploadFailed(f"upload {row.id} failed ({row.reason}); publish the file again for a new one")
            return UploadView(UploadId(row.id), state, 0, row.size, self.chunk_bytes, reason=row.reason)
        if state == UploadState.COMPLETE:
            artifact = await records.by_id(self.store, row.task_id, row.artifact_id or "")
            return UploadView(UploadId(row.id), state, row.size, row.size, self.chunk_bytes, artifact)
        offset = await self.blobs.staged(row.id)
        return UploadView(UploadId(row.id), state, offset, row.size, self.chunk_bytes)

    def _now(self) -> datetime:
        return utc(self.clock())
