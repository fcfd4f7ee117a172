"""Publishing a workspace file as a task artifact, and fetching one into the workspace.

Both stream: a publish reads and sends one piece (the server's `chunk_bytes`) at a time, a fetch
writes what arrives in pieces of `WRITE_PIECE`; neither holds a file in memory. Both resume
after a dropped connection or an orchestrator restart: a publish asks the server how much it
holds and goes on from there; a fetch asks for the rest with a `Range`. Both check integrity:

- publish declares the file's sha256 up front and the server refuses content that does not have
  it. If the file changed meanwhile the publish fails (`integrity_error`: publish it again once it
  is written); if it did not, the bytes were damaged on the way and the publish starts over once.
- fetch hashes what it writes, to a temporary file beside the target; only a whole file with the
  right sha256 is fsynced and renamed onto the target. A bad download is removed and tried once
  more from the start, then reported (`integrity_error`); the target is never left half-written.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO

import httpx2

from device_agent.transfer import Connection, Refused, TransferError, Transient

WRITE_PIECE = 256 * 1024  # a fetch buffers at most this much before writing it out
HASH_PIECE = 1024 * 1024
INTEGRITY_TRIES = 2


# ---------------------------------------------------------------- publish


async def publish(conn: Connection, batch_id: str, path: Path, name: str) -> dict[str, Any]:
    """Upload `path` as the artifact `name` of the task `batch_id` belongs to; its record."""
    size, digest = await asyncio.to_thread(file_digest, path, conn.link.max_bytes)
    what = f"publishing {name!r}"
    for attempt in range(INTEGRITY_TRIES):
        body = {"batch_id": batch_id, "name": name, "size": size, "sha256": digest}
        try:
            upload = await conn.call("POST", "/uploads", what, json=body)
            artifact = await _send(conn, upload, path, size, what)
            return {**artifact, "retries": conn.retries}
        except Refused as exc:
            if exc.code != "integrity_error":
                raise refusal(exc, what) from None
            now = await asyncio.to_thread(file_digest, path, conn.link.max_bytes)
            if now != (size, digest):
                raise TransferError(
                    "integrity_error",
                    f"{path.name} changed while it was being published (sha256 {digest} when it started, "
                    f"{now[1]} now): publish it again once nothing writes to it",
                ) from None
            if attempt + 1 == INTEGRITY_TRIES:
                raise TransferError(
                    "integrity_error",
                    f"the orchestrator received {path.name} damaged twice (its sha256 did not match): "
                    "check the network path to the orchestrator, then publish again",
                ) from None
    raise AssertionError("unreachable")


async def _send(conn: Connection, upload: dict[str, Any], path: Path, size: int, what: str) -> dict[str, Any]:
    """Send the pieces the server does not hold yet; the artifact once the upload is complete."""
    piece_bytes = max(1, int(upload["chunk_bytes"]))
    while upload["state"] == "open":
        offset = int(upload["offset"])
        piece = await asyncio.to_thread(_read_piece, path, offset, min(piece_bytes, size - offset))
        headers = {"Upload-Offset": str(offset), "Content-Type": "application/offset+octet-stream"}
        try:
            upload = await conn.call("PATCH", f"/uploads/{upload['id']}", what, content=piece, headers=headers)
        except Refused as exc:
            if exc.code != "offset_mismatch":
                raise
            upload = {**upload, "offset": int(exc.problem.get("offset", 0))}  # a retry of a piece that arrived
    if upload["state"] != "complete" or "artifact" not in upload:
        raise TransferError("transfer_failed", f"{what}: the upload ended {upload['state']}: {upload.get('reason')}")
    artifact: dict[str, Any] = upload["artifact"]
    return artifact


def file_digest(path: Path, limit: int) -> tuple[int, str]:
    """The size and sha256 of a regular file, read in pieces (refused over `limit` bytes)."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise TransferError("artifact_too_large", _too_large(path.name, size, limit))
        digest = hashlib.sha256()
        while piece := f.read(HASH_PIECE):
            digest.update(piece)
    return size, digest.hexdigest()


def _read_piece(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise TransferError(
            "integrity_error",
            f"{path.name} got shorter while it was being published: publish it again once nothing writes to it",
        )
    return data


# ---------------------------------------------------------------- fetch


async def fetch(conn: Connection, batch_id: str, name: str | None, sha256: str | None, target: Path) -> dict[str, Any]:
    """Download the artifact (newest with `name` and/or `sha256` in the batch's task) to `target`."""
    what = f"fetching {name!r}" if name else f"fetching sha256 {sha256}"
    params = {"batch_id": batch_id, **({"name": name} if name else {}), **({"sha256": sha256} if sha256 else {})}
    try:
        meta = await conn.call("GET", "", what, params=params)
    except Refused as exc:
        raise refusal(exc, what) from None
    size, digest = int(meta["size"]), str(meta["sha256"])
    if size > conn.link.max_bytes:
        raise TransferError("artifact_too_large", _too_large(str(meta["name"]), size, conn.link.max_bytes))
    partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    try:
        for attempt in range(INTEGRITY_TRIES):
            got = await _download(conn, batch_id, digest, size, partial, what)
            if got == digest:
                await asyncio.to_thread(_put_in_place, partial, target)
                return {**meta, "retries": conn.retries}
            if attempt + 1 == INTEGRITY_TRIES:
                raise TransferError(
                    "integrity_error",
                    f"{what}: the bytes received twice have sha256 {got}, not {digest}; the bad download was "
                    "removed. The orchestrator's copy may be damaged: publish the file again",
                )
    finally:
        partial.unlink(missing_ok=True)
    raise AssertionError("unreachable")


async def _download(conn: Connection, batch_id: str, digest: str, size: int, partial: Path, what: str) -> str:
    """Stream the blob into `partial`, resuming with a Range after transient failures; its sha256."""
    hasher = hashlib.sha256()
    written = 0
    with partial.open("wb") as out:
        while True:
            headers = {"Range": f"bytes={written}-", "If-Range": f'"{digest}"'} if written else {}
            buffer = bytearray()
            failure: Exception | None = None
            try:
                async with conn.stream(f"/{digest}/content", params={"batch_id": batch_id}, headers=headers) as resp:
                    if written and resp.status_code != 206:  # the server sends it all again
                        out.seek(0)
                        out.truncate()
                        hasher, written = hashlib.sha256(), 0
                    async for part in resp.aiter_bytes():
                        buffer += part
                        if len(buffer) >= WRITE_PIECE:
                            written += await _write(out, hasher, buffer)
                            buffer.clear()
            except Refused as exc:
                raise refusal(exc, what) from None
            except (Transient, httpx2.TransportError) as exc:
                failure = exc
            written += await _write(out, hasher, buffer)  # what arrived intact, also before a cut
            if written > size:
                return ""  # more bytes than the artifact has: not it
            if written == size:
                return hasher.hexdigest()
            await conn.pause(failure or Transient(f"the stream ended after {written} of {size} bytes"), what)


async def _write(out: BinaryIO, hasher: Any, data: bytearray) -> int:
    if not data:
        return 0
    chunk = bytes(data)
    await asyncio.to_thread(_write_and_hash, out, hasher, chunk)
    return len(chunk)


def _write_and_hash(out: BinaryIO, hasher: Any, chunk: bytes) -> None:
    out.write(chunk)
    hasher.update(chunk)


def _put_in_place(partial: Path, target: Path) -> None:
    """fsync the checked download and rename it over the target (readers see the old file or the
    new one, whole), keeping an existing target's mode as files.write does."""
    with partial.open("rb+") as f:
        os.fsync(f.fileno())
    try:
        os.chmod(partial, stat.S_IMODE(target.stat().st_mode))
    except FileNotFoundError:
        pass  # a new file: created 0666 less the umask, as any other
    os.replace(partial, target)


def refusal(exc: Refused, what: str) -> TransferError:
    """The tool's error for a final refusal of the orchestrator."""
    if exc.code == "artifact_too_large":
        return TransferError("artifact_too_large", f"{what}: {exc.detail}")
    if exc.code == "quota_exceeded":  # the detail names the quota, its use and what to do instead
        return TransferError("quota_exceeded", f"{what}: {exc.detail}")
    if exc.status == 404:
        return TransferError("artifact_not_found", f"{what}: {exc.detail}")
    if exc.code == "validation_error":
        return TransferError("invalid_arguments", f"{what}: {exc.detail}")
    if exc.status == 401:
        return TransferError("transfer_failed", f"{what}: the orchestrator refused this device's token ({exc.detail})")
    return TransferError("transfer_failed", f"{what}: the orchestrator refused it: {exc.code}: {exc.detail}")


def _too_large(name: str, size: int, limit: int) -> str:
    return (
        f"{name} is {size} bytes, over this device's limit of {limit} bytes for an artifact "
        "(max_artifact_bytes in the agent's settings); compress or split it"
    )
