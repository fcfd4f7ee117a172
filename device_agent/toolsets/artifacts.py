"""`files.publish_artifact` and `files.fetch_artifact`: move files between devices through the
orchestrator, as artifacts of the task (transfers in device_agent/artifacts.py).

They are tools of the `files` namespace, registered on its server (`register`), and act for the
batch the agent is running (`ToolsetContext.current_batch`), with the agent's server URLs, device
token and CA file (`ToolsetContext.artifacts`). Paths are workspace paths, as for every `files`
tool; a path outside the workspace (`..`, absolute, a symlink leading out) or with a NUL byte is
refused with `invalid_arguments` before anything is read, written or sent.

Annotations tell what they do: publishing changes nothing on the device and is idempotent (the
same content under the same name is the same artifact, however often it is published); fetching
writes (or replaces) a file, so it is destructive, but it is idempotent too (the same artifact
gives the same file). Both are retried by the engine when a node's attempt is lost.
"""

from __future__ import annotations

import asyncio
import re
import stat
import time
from pathlib import Path
from typing import Annotated, NotRequired

from mcp.types import CallToolResult
from pydantic import Field
from typing_extensions import TypedDict

from device_agent import artifacts
from device_agent.policy import PolicyDenied, contain
from device_agent.toolsets.base import Toolkit, ToolsetContext, action, failure, success, tool
from device_agent.transfer import ArtifactLink, Connection, TransferError

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$"  # the orchestrator's (orchestrator/artifacts/model.py)
_NAME = re.compile(NAME_PATTERN)
SHA256_PATTERN = r"^[0-9a-fA-F]{64}$"
DEFAULT_TIMEOUT_S = 300.0
DEADLINE_MARGIN_S = 1.0  # the tool answers before the router's own limit would cut it off

PathArg = Annotated[str, Field(description="Path relative to the workspace, e.g. 'logs/merged.log'.")]
Timeout = Annotated[
    float | None, Field(gt=0, description="Seconds for the whole transfer, retries included (default 300).")
]


class Published(TypedDict):
    name: str
    version: int
    sha256: str
    size: int
    retries: NotRequired[int]


class Fetched(TypedDict):
    path: str
    name: str
    version: int
    sha256: str
    size: int
    retries: NotRequired[int]


def register(kit: Toolkit, ctx: ToolsetContext) -> None:
    """Add the two artifact tools to the `files` server."""

    @tool(kit, action(idempotent=True, destructive=False))
    async def publish_artifact(
        path: PathArg,
        name: Annotated[
            str | None,
            Field(
                pattern=NAME_PATTERN,
                description="Artifact name (default: the file's name): letters, digits, '.', '_', '-'.",
            ),
        ] = None,
        timeout_s: Timeout = None,
    ) -> Annotated[CallToolResult, Published]:
        """Publish a workspace file as an artifact of this task, for nodes on other devices to
        fetch (files.fetch_artifact) and people to download.

        Artifacts are content-addressed: publishing the same content under the same name again
        changes nothing, so it is safe to retry; other content under a name already used becomes
        its newest version (the older ones are kept). Returns the name, version, sha256 and size.
        The upload survives a dropped connection or an orchestrator restart and goes on where it
        stopped.
        """
        return await _publish(ctx, path, name, timeout_s)

    @tool(kit, action(idempotent=True, destructive=True))
    async def fetch_artifact(
        path: PathArg,
        name: Annotated[
            str | None, Field(pattern=NAME_PATTERN, description="The artifact's name (its newest version).")
        ] = None,
        sha256: Annotated[
            str | None, Field(pattern=SHA256_PATTERN, description="The artifact's sha256 (a version exactly).")
        ] = None,
        timeout_s: Timeout = None,
    ) -> Annotated[CallToolResult, Fetched]:
        """Download an artifact of this task into the workspace at path (parent directories are
        created; an existing file there is replaced, atomically).

        Name it by name (its newest version), by sha256, or by both. The file is checked against
        the artifact's sha256 before it is put in place, so the path never holds a partial or
        damaged file. Returns the path, name, version, sha256 and size. Only artifacts published
        before this node ran can be fetched: an edge from the publishing node makes sure of that.
        """
        return await _fetch(ctx, path, name, sha256, timeout_s)


async def _publish(ctx: ToolsetContext, path: str, name: str | None, timeout_s: float | None) -> CallToolResult:
    try:
        source = _inside(ctx, path)
        batch_id, link = _running(ctx)
        await asyncio.to_thread(_regular_file, source, path)
        artifact_name = name or source.name
        if not _valid_name(artifact_name):
            raise TransferError(
                "invalid_arguments",
                f"the file name {artifact_name!r} cannot be an artifact name: pass name (letters, digits, "
                "'.', '_', '-', not starting with '.' or '-')",
            )
        async with Connection(link, _deadline(timeout_s)) as conn:
            return success(await artifacts.publish(conn, batch_id, source, artifact_name))
    except TransferError as exc:
        return failure(exc.code, str(exc))
    except OSError as exc:
        return failure("tool_error", f"{path!r}: {exc.strerror or type(exc).__name__}", errno=exc.errno)


async def _fetch(
    ctx: ToolsetContext, path: str, name: str | None, sha256: str | None, timeout_s: float | None
) -> CallToolResult:
    try:
        if name is None and sha256 is None:
            raise TransferError("invalid_arguments", "name the artifact to fetch: pass name, sha256 or both")
        target = _inside(ctx, path)
        batch_id, link = _running(ctx)
        await asyncio.to_thread(_writable_target, target, path)
        async with Connection(link, _deadline(timeout_s)) as conn:
            got = await artifacts.fetch(conn, batch_id, name, sha256.lower() if sha256 else None, target)
        return success({"path": target.relative_to(ctx.workspace.resolve()).as_posix(), **got})
    except TransferError as exc:
        return failure(exc.code, str(exc))
    except OSError as exc:
        return failure("tool_error", f"{path!r}: {exc.strerror or type(exc).__name__}", errno=exc.errno)


def _inside(ctx: ToolsetContext, path: str) -> Path:
    """The workspace path, or `invalid_arguments` (the files toolset's containment rules)."""
    try:
        return contain(ctx.workspace, path)
    except PolicyDenied as exc:
        raise TransferError("invalid_arguments", str(exc)) from None


def _running(ctx: ToolsetContext) -> tuple[str, ArtifactLink]:
    batch = ctx.current_batch()
    if batch is None:
        raise TransferError("tool_error", "artifacts are published and fetched by a command of a task's batch")
    if ctx.artifacts is None:
        raise TransferError("tool_error", "this agent has no orchestrator to move artifacts through")
    return batch.batch_id, ctx.artifacts


def _regular_file(source: Path, path: str) -> None:
    try:
        info = source.stat()
    except FileNotFoundError:
        raise TransferError(
            "invalid_arguments", f"{path!r} does not exist; see what is there with files.list"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise TransferError("invalid_arguments", f"{path!r} is not a regular file; publish a file, not a directory")


def _writable_target(target: Path, path: str) -> None:
    if target.is_dir():
        raise TransferError("invalid_arguments", f"{path!r} is a directory; give a file path inside it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise TransferError(
            "invalid_arguments", f"a parent of {path!r} is a file, not a directory; choose another path"
        ) from None


def _valid_name(name: str) -> bool:
    # Whole: `match` would let `$` accept a file name ending in a newline ("rep\n").
    return _NAME.fullmatch(name) is not None


def _deadline(timeout_s: float | None) -> float:
    return time.monotonic() + max(1.0, (timeout_s or DEFAULT_TIMEOUT_S) - DEADLINE_MARGIN_S)
