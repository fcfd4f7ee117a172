"""The artifacts of one orchestrator process: its blob store, its uploads, and reading blobs.

Built once at start-up from the settings (`ORRERY_ARTIFACT_STORE`: `database` on Postgres and
`files` on SQLite unless told otherwise) and handed to the API through the components.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from orchestrator.artifacts.blobs import BlobStore, FileBlobs
from orchestrator.artifacts.dbblobs import DatabaseBlobs
from orchestrator.artifacts.model import ArtifactRecord
from orchestrator.artifacts.quota import Quota
from orchestrator.artifacts.ranges import ByteRange
from orchestrator.artifacts.uploads import Uploads
from orchestrator.config import Settings
from orchestrator.store.db import is_sqlite
from orchestrator.store.repo import Store

CHUNK_BYTES = 1024 * 1024  # a piece of an upload: one request body (capped by ORRERY_MAX_REQUEST_BYTES)


@dataclass
class Artifacts:
    store: Store
    blobs: BlobStore
    uploads: Uploads

    @classmethod
    def create(cls, settings: Settings, store: Store) -> Artifacts:
        kind = settings.artifact_store
        if kind == "auto":
            kind = "files" if is_sqlite(store.url) else "database"
        blobs: BlobStore
        if kind == "files":
            blobs = FileBlobs(settings.artifact_dir or settings.data_dir / "artifacts")
        else:
            blobs = DatabaseBlobs(store)
        chunk = min(CHUNK_BYTES, settings.max_request_bytes)
        limits = Quota(
            task_bytes=settings.artifact_task_quota_bytes,
            task_count=settings.artifact_task_quota_count,
            device_bytes=settings.artifact_device_quota_bytes,
            device_count=settings.artifact_device_quota_count,
        )
        return cls(store, blobs, Uploads(store, blobs, settings.max_artifact_bytes, chunk, quota=limits))

    def content(self, artifact: ArtifactRecord, span: ByteRange) -> AsyncIterator[bytes]:
        """The artifact's bytes in `span`, in pieces."""
        return self.blobs.read(artifact.sha256, span.start, span.end)
