"""Saving an artifact to a local file for the CLI (`orrery artifacts get`), checked by sha256.

The content is streamed to `<file>.partial` beside the destination while it is hashed; a dropped
connection resumes with a `Range` for the rest (the `ETag` in `If-Range` makes sure it is the
same content); only a file whose sha256 is the artifact's is renamed onto the destination, so a
failed or damaged download never leaves a file that looks complete.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import httpx

from orchestrator.client import Client, ClientError

TRIES = 4  # streams opened for one download (the first and up to three resumptions)
PIECE = 256 * 1024


def save(client: Client, task_id: str, name: str, version: int | None, dest: Path) -> dict[str, Any]:
    """Download the artifact (its newest version, or `version`) to `dest`; its record."""
    artifact = client.artifact(task_id, name, version)
    partial = dest.with_name(f"{dest.name}.partial")
    try:
        digest = _fetch(client, artifact, partial)
        if digest != artifact["sha256"]:
            raise ClientError(
                0,
                "integrity_error",
                f"the downloaded bytes have sha256 {digest}, not the artifact's {artifact['sha256']}; nothing was "
                "saved: try again",
            )
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return artifact


def _fetch(client: Client, artifact: dict[str, Any], partial: Path) -> str:
    size = int(artifact["size"])
    path = artifact["content_url"]
    hasher = hashlib.sha256()
    written = 0
    last: Exception | None = None
    with partial.open("wb") as out:
        for _ in range(TRIES):
            headers = {"Range": f"bytes={written}-", "If-Range": f'"{artifact["sha256"]}"'} if written else {}
            try:
                with client.stream(path, headers) as resp:
                    if written and resp.status_code != 206:  # the whole content again
                        out.seek(0)
                        out.truncate()
                        hasher, written = hashlib.sha256(), 0
                    for piece in resp.iter_bytes(PIECE):
                        out.write(piece)
                        hasher.update(piece)
                        written += len(piece)
            except httpx.TransportError as exc:
                last = exc
            if written >= size:
                out.flush()
                os.fsync(out.fileno())
                return hasher.hexdigest()
    raise ClientError(0, "unreachable", f"the download stopped after {written} of {size} bytes ({last}); try again")
