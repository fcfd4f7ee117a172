"""What an artifact is: its name, its content address, its upload's states."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, NewType

from orchestrator.artifacts.errors import InvalidArtifact

ArtifactId = NewType("ArtifactId", str)
UploadId = NewType("UploadId", str)
Sha256 = NewType("Sha256", str)

# One path component, so a name is also a safe file name (a download's `Content-Disposition`,
# a fetch's default path, a CLI argument): letters, digits, `.`, `_`, `-`, not starting with `.` or `-`.
# Matched whole (`fullmatch`): with `match`, `$` would also accept a trailing newline, and a
# name ending in one breaks the download's `Content-Disposition` header.
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$"
_NAME = re.compile(NAME_PATTERN)
SHA256_PATTERN = r"^[0-9a-f]{64}$"
_SHA256 = re.compile(SHA256_PATTERN)


class UploadState(StrEnum):
    OPEN = "open"  # taking bytes
    COMPLETE = "complete"  # every byte in, checked, promoted and recorded
    FAILED = "failed"  # ended without an artifact; its staged bytes are gone


def artifact_name(name: str) -> str:
    """`name` if an artifact may be called that, else `InvalidArtifact` saying what would do."""
    if not _NAME.fullmatch(name):
        raise InvalidArtifact(
            f"artifact name {name[:80]!r} is not allowed: use 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter, digit or '_' (one file name, no '/'), e.g. 'merged.log'"
        )
    return name


def content_address(sha256: str) -> Sha256:
    """A sha256 as 64 lower-case hex digits (upper case is accepted and lowered)."""
    value = sha256.lower()
    if not _SHA256.fullmatch(value):
        raise InvalidArtifact(f"sha256 {sha256[:80]!r} is not 64 hex digits")
    return Sha256(value)


@dataclass(frozen=True)
class ArtifactRecord:
    """One recorded version of a task's artifact, as every reader sees it."""

    id: ArtifactId
    task_id: str
    name: str
    version: int
    sha256: Sha256
    size: int
    node_id: str
    batch_id: str
    device_id: str
    created_at: datetime

    def summary(self) -> dict[str, Any]:
        """What a device is told about it (a publish's answer, a fetch's lookup)."""
        return {"name": self.name, "version": self.version, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class UploadView:
    """An upload as its device sees it: where to go on from, and the artifact once complete."""

    id: UploadId
    state: UploadState
    offset: int
    size: int
    chunk_bytes: int
    artifact: ArtifactRecord | None = None
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "state": self.state.value,
            "offset": self.offset,
            "size": self.size,
            "chunk_bytes": self.chunk_bytes,
        }
        if self.artifact is not None:
            out["artifact"] = self.artifact.summary()
        if self.reason:
            out["reason"] = self.reason
        return out
