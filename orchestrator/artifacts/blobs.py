"""Where artifact bytes live: the `BlobStore` interface, and the embedded default on files.

A blob is named by its sha256 and shared by every artifact with that content. An upload's bytes
are staged under the upload's id until all are in and checked, then promoted to the blob. Both
stores stream: they take one piece at a time and hand back pieces, never a whole blob.

`FileBlobs` (SQLite deployments) keeps `uploads/<upload id>` and `blobs/<sha[:2]>/<sha>` under
the artifact dir (default `<data dir>/artifacts`, 0700, files 0600). A piece is appended to the
staging file, so what is staged is the file's length, which survives a killed process; a
promotion fsyncs the file, renames it into place and fsyncs both directories, so a blob that
exists is whole (a reader with the old file open keeps reading it). A replicated deployment uses
the database store (`dbblobs.DatabaseBlobs`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

from orchestrator.artifacts.errors import ArtifactNotFound, IntegrityFailed, OffsetMismatch

READ_PIECE = 256 * 1024  # what one read hands on (memory per stream, not a protocol size)
LOCK_STRIPES = 64  # pieces of one upload are appended one at a time (a retry may race its original)


class BlobStore(Protocol):
    kind: str  # "files" or "database", as the docs and `/readyz` name it

    async def staged(self, upload_id: str) -> int:
        """How many bytes of the upload are staged (where its next piece goes)."""
        ...

    async def append(self, upload_id: str, start: int, data: bytes) -> int:
        """Stage `data` at `start`, which must be the staged end (else `OffsetMismatch` with the
        right `offset`); returns the new end."""
        ...

    def read_staged(self, upload_id: str, start: int, end: int) -> AsyncIterator[bytes]:
        """The staged bytes `[start, end)`, in pieces."""
        ...

    async def promote(self, upload_id: str, sha256: str, size: int) -> None:
        """Make the staged bytes (checked by the caller) the blob `sha256`; idempotent, and the
        staged copy is gone afterwards."""
        ...

    async def discard(self, upload_id: str) -> None:
        """Forget the upload's staged bytes (never those a blob was promoted from)."""
        ...

    async def has(self, sha256: str) -> bool: ...

    def read(self, sha256: str, start: int, end: int) -> AsyncIterator[bytes]:
        """The blob's bytes `[start, end)`, in pieces; `ArtifactNotFound` if it is not there."""
        ...


class FileBlobs:
    kind = "files"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uploads = root / "uploads"
        self.blobs = root / "blobs"
        for path in (root, self.uploads, self.blobs):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(path, 0o700)
        self._locks = [asyncio.Lock() for _ in range(LOCK_STRIPES)]

    def _staging(self, upload_id: str) -> Path:
        return self.uploads / upload_id

    def blob_path(self, sha256: str) -> Path:
        return self.blobs / sha256[:2] / sha256

    async def staged(self, upload_id: str) -> int:
        try:
            return (await asyncio.to_thread(os.stat, self._staging(upload_id))).st_size
        except FileNotFoundError:
            return 0

    async def append(self, upload_id: str, start: int, data: bytes) -> int:
        async with self._locks[hash(upload_id) % LOCK_STRIPES]:
            return await asyncio.to_thread(self._append, self._staging(upload_id), start, data)

    @staticmethod
    def _append(path: Path, start: int, data: bytes) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            end = os.fstat(fd).st_size
            if end != start:
                raise OffsetMismatch.at(end, start)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            return end + len(data)
        finally:
            os.close(fd)

    def read_staged(self, upload_id: str, start: int, end: int) -> AsyncIterator[bytes]:
        return _read_file(self._staging(upload_id), start, end, f"upload {upload_id}")

    async def promote(self, upload_id: str, sha256: str, size: int) -> None:
        await asyncio.to_thread(self._promote, self._staging(upload_id), self.blob_path(sha256), size)

    def _promote(self, staged: Path, blob: Path, size: int) -> None:
        if not staged.exists():
            if blob.exists():
                return  # promoted already (the answer was lost, or a twin upload won)
            raise IntegrityFailed("the upload's staged bytes are gone; publish the file again")
        # A blob stored already is replaced by this checked copy (a rename): the same content, and
        # a stored copy damaged since (bit rot, a careless hand) heals with its next upload.
        with staged.open("rb+") as f:
            if os.fstat(f.fileno()).st_size != size:
                raise IntegrityFailed("the upload's staged bytes changed size; publish the file again")
            os.fsync(f.fileno())
        blob.parent.mkdir(exist_ok=True, mode=0o700)
        os.replace(staged, blob)
        for directory in (blob.parent, staged.parent):
            _fsync_dir(directory)

    async def discard(self, upload_id: str) -> None:
        await asyncio.to_thread(self._staging(upload_id).unlink, True)

    async def has(self, sha256: str) -> bool:
        return await asyncio.to_thread(self.blob_path(sha256).is_file)

    def read(self, sha256: str, start: int, end: int) -> AsyncIterator[bytes]:
        return _read_file(self.blob_path(sha256), start, end, f"blob {sha256}")


async def _read_file(path: Path, start: int, end: int, what: str) -> AsyncIterator[bytes]:
    try:
        f = await asyncio.to_thread(path.open, "rb")
    except FileNotFoundError:
        raise ArtifactNotFound(f"the {what} is missing from the artifact store") from None
    try:
        await asyncio.to_thread(f.seek, start)
        left = end - start
        while left > 0:
            piece = await asyncio.to_thread(f.read, min(READ_PIECE, left))
            if not piece:
                raise IntegrityFailed(f"the {what} is shorter than recorded ({end - left} of {end} bytes)")
            left -= len(piece)
            yield piece
    finally:
        await asyncio.to_thread(f.close)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
