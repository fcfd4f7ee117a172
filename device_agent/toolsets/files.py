"""The `files` toolset: read, write, append, list and delete files inside the workspace (SPEC section 5);
publish and fetch artifacts.

Every path goes through `policy.contain`, so `..`, absolute paths and symlinks that lead out of
the workspace are refused with `policy_denied`. The file work itself is blocking, so it runs in a
worker thread: the agent's event loop keeps sending heartbeats while a large file is read.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult
from pydantic import Field
from typing_extensions import TypedDict

from device_agent.policy import PolicyDenied, check_action, contain
from device_agent.toolsets import artifacts
from device_agent.toolsets.base import READ_ONLY, Toolkit, ToolsetContext, action, failure, success, tool

Encoding = Literal["utf-8", "base64"]
PathArg = Annotated[str, Field(description="Path relative to the workspace, e.g. 'logs/app.txt'.")]
Content = Annotated[str, Field(description="The content, as text or base64 (see encoding).")]
EncodingArg = Annotated[Encoding, Field(description='"utf-8" for text, "base64" for binary content.')]


class ReadResult(TypedDict):
    path: str
    content: str
    size: int
    encoding: Encoding


class WriteResult(TypedDict):
    path: str
    size: int
    sha256: str


class Entry(TypedDict):
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int | None


class ListResult(TypedDict):
    path: str
    entries: list[Entry]
    truncated: bool


class DeleteResult(TypedDict):
    path: str
    deleted: bool


class _Refused(Exception):
    """An expected failure inside the worker thread, turned into a `failure` result."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def build(ctx: ToolsetContext) -> MCPServer:
    """The `files` MCP server: `read`, `write`, `append`, `list`, `delete`."""
    kit = Toolkit("files")

    @tool(kit, READ_ONLY)
    async def read(path: PathArg) -> Annotated[CallToolResult, ReadResult]:
        """Read a file from the workspace.

        UTF-8 text comes back as is (encoding "utf-8"); any other bytes come back base64-encoded
        (encoding "base64"). Files over the device's size limit are refused: read part of them
        with shell.run (head, tail, grep) instead.
        """
        return await _in_thread(_read, ctx, path)

    # MCP hints are per tool, not per call, and the engine retries an `uncertain` attempt only
    # when every tool it called is idempotent (SPEC section 2). Writing the same content twice
    # leaves the same file; appending twice does not, so appending is a tool of its own.
    @tool(kit, action(idempotent=True, destructive=True))
    async def write(
        path: PathArg, content: Content, encoding: EncodingArg = "utf-8"
    ) -> Annotated[CallToolResult, WriteResult]:
        """Create or replace a file in the workspace (missing parent directories are created).

        Replacing is atomic: readers see the old or the new content, never a mix. Returns the
        file's size and SHA-256 after the write. Writing the same content again changes nothing,
        so it is safe to retry. To add to the end of a file use files.append.
        """
        return await _in_thread(_write, ctx, path, content, encoding)

    @tool(kit, action(idempotent=False, destructive=True))
    async def append(
        path: PathArg, content: Content, encoding: EncodingArg = "utf-8"
    ) -> Annotated[CallToolResult, WriteResult]:
        """Add content to the end of a file in the workspace (it is created if missing).

        Returns the whole file's size and SHA-256 after the append. Each call adds the content
        again, so it is not retried automatically: after an uncertain outcome, read the file
        (files.read) to see whether the content is there before appending again.
        """
        return await _in_thread(_append, ctx, path, content, encoding)

    # Named `list` on the wire (SPEC section 5); `list_dir` here so the builtin stays usable.
    @tool(kit, READ_ONLY, name="list")
    async def list_dir(
        path: Annotated[str, Field(description="Directory relative to the workspace.")] = ".",
        limit: Annotated[int, Field(ge=1, le=10_000, description="Maximum entries returned.")] = 1000,
    ) -> Annotated[CallToolResult, ListResult]:
        """List a directory of the workspace: entries sorted by name, each with its type
        (file, dir, symlink, other) and size in bytes (files only). Symlinks are not followed.
        """
        return await _in_thread(_list, ctx, path, limit)

    @tool(kit, action(idempotent=True, destructive=True))
    async def delete(
        path: PathArg,
        recursive: Annotated[bool, Field(description="Required to delete a directory and everything in it.")] = False,
    ) -> Annotated[CallToolResult, DeleteResult]:
        """Delete a file, a symlink (not its target) or, with recursive=true, a directory.

        Deleting something that does not exist succeeds with deleted=false, so it is safe to
        repeat. The workspace itself cannot be deleted.
        """
        return await _in_thread(_delete, ctx, path, recursive)

    artifacts.register(kit, ctx)  # publish_artifact, fetch_artifact
    return kit.server()


async def _in_thread(
    fn: Callable[..., CallToolResult], ctx: ToolsetContext, path: str, *args: object
) -> CallToolResult:
    """Run `fn(ctx, path, *args)` in a worker thread, mapping expected exceptions to failures."""
    try:
        return await asyncio.to_thread(fn, ctx, path, *args)
    except (PolicyDenied, _Refused) as exc:
        return failure(exc.code, str(exc))
    except OSError as exc:
        # The OS message names the absolute path; the caller only knows the relative one.
        reason = exc.strerror or type(exc).__name__
        return failure("tool_error", f"{path!r}: {reason}", errno=exc.errno)


def _relative(ctx: ToolsetContext, target: Path) -> str:
    return target.relative_to(ctx.workspace.resolve()).as_posix() or "."


def _missing(path: str) -> _Refused:
    parent = Path(path).parent.as_posix()
    return _Refused(
        "tool_error",
        f"{path!r} does not exist; list the directory with files.list (path {parent!r}) to see what is there",
    )


def _read(ctx: ToolsetContext, path: str) -> CallToolResult:
    target = contain(ctx.workspace, path)
    limit = ctx.policy.max_file_bytes
    try:
        info = target.stat()
    except FileNotFoundError:
        raise _missing(path) from None
    if stat.S_ISDIR(info.st_mode):
        raise _Refused("tool_error", f"{path!r} is a directory; use files.list to see its entries")
    if not stat.S_ISREG(info.st_mode):
        # Reading a FIFO or a device could block forever or never end.
        raise _Refused("tool_error", f"{path!r} is not a regular file and cannot be read")
    if info.st_size > limit:
        raise _Refused("invalid_arguments", _too_big(path, info.st_size, limit))
    with target.open("rb") as f:
        data = f.read(limit + 1)  # the file may have grown since stat()
    if len(data) > limit:
        raise _Refused("invalid_arguments", _too_big(path, len(data), limit))
    try:
        content, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        content, encoding = base64.b64encode(data).decode("ascii"), "base64"
    return success({"path": _relative(ctx, target), "content": content, "size": len(data), "encoding": encoding})


def _too_big(path: str, size: int, limit: int) -> str:
    return (
        f"{path!r} is {size} bytes, over this device's limit of {limit} bytes for files.read; "
        "read part of it with shell.run (head, tail, grep) instead"
    )


def _write(ctx: ToolsetContext, path: str, content: str, encoding: str) -> CallToolResult:
    target, data = _prepare(
        ctx, path, content, encoding, "write it in parts: files.write the first, files.append the rest"
    )
    _replace_atomically(target, data)
    return success({"path": _relative(ctx, target), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})


def _append(ctx: ToolsetContext, path: str, content: str, encoding: str) -> CallToolResult:
    target, data = _prepare(ctx, path, content, encoding, "append it in several smaller parts")
    with target.open("ab") as f:
        f.write(data)
    digest, size = _sha256_of(target)
    return success({"path": _relative(ctx, target), "size": size, "sha256": digest})


def _prepare(ctx: ToolsetContext, path: str, content: str, encoding: str, too_big_hint: str) -> tuple[Path, bytes]:
    """Checks shared by write and append: policy, containment, size; creates missing parents."""
    check_action(ctx.policy, tool_is_read_only=False)
    target = contain(ctx.workspace, path)
    data = _decode(content, encoding)
    if len(data) > ctx.policy.max_file_bytes:
        raise _Refused(
            "invalid_arguments",
            f"content is {len(data)} bytes, over this device's limit of {ctx.policy.max_file_bytes} bytes; "
            + too_big_hint,
        )
    if target.is_dir():
        raise _Refused("tool_error", f"{path!r} is a directory; write to a file path inside it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise _Refused("tool_error", f"a parent of {path!r} is a file, not a directory; choose another path") from None
    return target, data


def _decode(content: str, encoding: str) -> bytes:
    if encoding == "utf-8":
        return content.encode("utf-8")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise _Refused(
            "invalid_arguments", 'content is not valid base64; send text with encoding "utf-8" instead'
        ) from None


def _replace_atomically(target: Path, data: bytes) -> None:
    """Write a sibling temp file and rename it over `target`, keeping an existing file's mode."""
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = None
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    # 0o666 is filtered by the umask, as for any newly created file.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _sha256_of(target: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with target.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _list(ctx: ToolsetContext, path: str, limit: int) -> CallToolResult:
    target = contain(ctx.workspace, path)
    if not target.exists():
        raise _missing(path)
    if not target.is_dir():
        raise _Refused("tool_error", f"{path!r} is a file, not a directory; use files.read to read it")
    entries: list[Entry] = []
    with os.scandir(target) as it:
        for entry in it:
            entries.append(_entry(entry))
    entries.sort(key=lambda e: e["name"])
    return success({"path": _relative(ctx, target), "entries": entries[:limit], "truncated": len(entries) > limit})


def _entry(entry: os.DirEntry[str]) -> Entry:
    try:
        if entry.is_symlink():
            return {"name": entry.name, "type": "symlink", "size": None}
        if entry.is_dir(follow_symlinks=False):
            return {"name": entry.name, "type": "dir", "size": None}
        if entry.is_file(follow_symlinks=False):
            return {"name": entry.name, "type": "file", "size": entry.stat(follow_symlinks=False).st_size}
    except OSError:
        pass  # removed while listing: report it without a size
    return {"name": entry.name, "type": "other", "size": None}


def _delete(ctx: ToolsetContext, path: str, recursive: bool) -> CallToolResult:
    check_action(ctx.policy, tool_is_read_only=False)
    # The last component is not followed: deleting a symlink removes the link, not its target.
    target = contain(ctx.workspace, path, follow_symlinks=False)
    if target == ctx.workspace.resolve():
        raise PolicyDenied("the workspace itself cannot be deleted; delete the entries inside it instead")
    relative = _relative(ctx, target)
    if not os.path.lexists(target):
        return success({"path": relative, "deleted": False})
    if target.is_dir() and not target.is_symlink():
        if not recursive:
            raise _Refused(
                "invalid_arguments",
                f"{path!r} is a directory; pass recursive=true to delete it and everything in it",
            )
        shutil.rmtree(target)
    else:
        target.unlink()
    return success({"path": relative, "deleted": True})
