"""A real store (SQLite or Postgres, migrated) with a task and open batches, and a blob store of
each kind on it, for the artifact unit tests."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.artifacts.blobs import BlobStore, FileBlobs
from orchestrator.artifacts.dbblobs import DatabaseBlobs
from orchestrator.artifacts.uploads import Uploads
from orchestrator.store.migrate import upgrade
from orchestrator.store.models import Attempt, Task
from orchestrator.store.repo import ChangeSet, Store

AT = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
PIECE = 64 * 1024  # small pieces, so a few hundred KiB cross many chunk boundaries


@dataclass
class World:
    store: Store
    blobs: BlobStore
    tmp: Path

    def uploads(self, max_bytes: int = 10 * 1024 * 1024) -> Uploads:
        """An `Uploads` as a freshly started process has it (nothing in memory)."""
        return Uploads(self.store, self.blobs, max_bytes, PIECE)

    async def task(self, task_id: str) -> None:
        changes = ChangeSet()
        changes.insert(
            Task, {"id": task_id, "name": task_id, "state": "running", "priority": 0, "labels": {}, "created_at": AT}
        )
        await self.store.write(changes)

    async def batch(self, batch_id: str, task_id: str = "t1", device_id: str = "dev_a", node_id: str = "n1") -> str:
        changes = ChangeSet()
        changes.insert(
            Attempt,
            {
                "batch_id": batch_id,
                "kind": "tool",
                "task_id": task_id,
                "node_id": node_id,
                "n": 1,
                "device_id": device_id,
                "fence": 1,
                "commands": [],
                "status": "accepted",
                "started_at": AT,
            },
        )
        await self.store.write(changes)
        return batch_id

    async def end(self, batch_id: str) -> None:
        await self.store.update(Attempt, (batch_id,), ended_at=AT, status="failed")

    async def read(self, sha256: str, start: int, end: int) -> bytes:
        return b"".join([p async for p in self.blobs.read(sha256, start, end)])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["sqlite/files", "sqlite/database", "postgres/database"])
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    backend, kind = request.param.split("/")
    url = request.getfixturevalue("postgres_db") if backend == "postgres" else f"sqlite+aiosqlite:///{tmp_path}/o.db"
    await asyncio.to_thread(upgrade, url)
    store = Store(url)
    blobs: BlobStore = FileBlobs(tmp_path / "artifacts") if kind == "files" else DatabaseBlobs(store)
    w = World(store, blobs, tmp_path)
    await w.task("t1")
    await w.batch("b1")
    try:
        yield w
    finally:
        await store.close()
