"""The `system` toolset: what the device is and how it is doing (SPEC section 5; read-only).

Everything here reads the standard library or `/proc`: no psutil, so the agent installs anywhere
Python does. Figures a platform cannot give cheaply are reported as 0 or null, never guessed.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import socket
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult
from pydantic import Field
from typing_extensions import TypedDict

from device_agent.policy import PolicyDenied, contain
from device_agent.toolsets.base import READ_ONLY, Toolkit, ToolsetContext, failure, success, tool

_PROC = Path("/proc")
# /proc/<pid>/stat state letters (proc(5)), spelled out for a reader who is not a kernel hacker.
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "Z": "zombie",
    "T": "stopped",
    "t": "tracing-stop",
    "X": "dead",
    "I": "idle",
    "P": "parked",
    "W": "paging",
}

PlatformName = Literal["linux", "windows", "macos", "other"]


class DeviceInfo(TypedDict):
    platform: PlatformName
    os: str
    version: str
    hostname: str
    cpu_count: int
    memory_mb: int


class InfoResult(DeviceInfo):
    arch: str
    python: str
    uptime_s: float | None


class ProcessEntry(TypedDict):
    pid: int
    name: str
    state: str


class ProcessesResult(TypedDict):
    processes: list[ProcessEntry]
    total: int
    truncated: bool
    note: str | None


class DiskResult(TypedDict):
    path: str
    total_bytes: int
    used_bytes: int
    free_bytes: int


def platform_name() -> PlatformName:
    """The protocol's platform label for this interpreter's `sys.platform`."""
    if sys.platform.startswith("linux"):
        return "linux"
    if sys.platform in ("win32", "cygwin"):
        return "windows"
    if sys.platform == "darwin":
        return "macos"
    return "other"


def device_info() -> dict[str, Any]:
    """What the agent tells the orchestrator in `hello.info` (SPEC section 4); shaped like `DeviceInfo`."""
    info: DeviceInfo = {
        "platform": platform_name(),
        "os": platform.system(),
        "version": platform.release(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count() or 1,
        "memory_mb": _memory_mb(),
    }
    return dict(info)


def _memory_mb() -> int:
    try:
        for line in (_PROC / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024  # the kernel reports kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _uptime_s() -> float | None:
    try:
        return float((_PROC / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _info() -> dict[str, Any]:
    return {
        **device_info(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "uptime_s": _uptime_s(),
    }


def _processes(limit: int) -> ProcessesResult:
    if not (_PROC / "self" / "stat").exists():
        note = f"process listing needs /proc, which {platform_name()} does not have; use shell.run (ps or tasklist)"
        return {"processes": [], "total": 0, "truncated": False, "note": note}
    found: list[ProcessEntry] = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (parsed := _parse_stat(entry)) is not None:
            found.append(parsed)
    found.sort(key=lambda p: p["pid"])
    return {"processes": found[:limit], "total": len(found), "truncated": len(found) > limit, "note": None}


def _parse_stat(proc_dir: Path) -> ProcessEntry | None:
    try:
        raw = (proc_dir / "stat").read_text(errors="replace")
    except OSError:
        return None  # exited while we were listing
    # "pid (comm) state ...": comm may itself contain spaces and parentheses, so split on the last ")".
    head, _, tail = raw.rpartition(")")
    pid, _, name = head.partition(" (")
    letter = tail.split(maxsplit=1)[0] if tail.strip() else "?"
    try:
        return {"pid": int(pid), "name": name, "state": _STATES.get(letter, letter)}
    except ValueError:
        return None


class EchoResult(TypedDict):
    text: str


def build(ctx: ToolsetContext) -> MCPServer:
    """The `system` MCP server: `info`, `echo`, `processes`, `disk`, all read-only."""
    kit = Toolkit("system")

    @tool(kit, READ_ONLY)
    async def info() -> Annotated[CallToolResult, InfoResult]:
        """Describe the device: platform (linux, windows, macos, other), OS name and release,
        hostname, CPU count, total memory in MB (0 if unknown), CPU architecture, Python version
        and uptime in seconds (null if unknown). Use it to choose commands that exist here.
        """
        return success(_info())

    @tool(kit, READ_ONLY)
    async def echo(
        text: Annotated[str, Field(max_length=65_536, description="Any text; it comes back unchanged.")] = "",
    ) -> Annotated[CallToolResult, EchoResult]:
        """Return `text` unchanged. A no-op: use it to check that the device answers, or to time a
        round trip without doing any work on the device."""
        return success({"text": text})

    @tool(kit, READ_ONLY)
    async def processes(
        limit: Annotated[int, Field(ge=1, le=10_000, description="Maximum processes returned.")] = 50,
    ) -> Annotated[CallToolResult, ProcessesResult]:
        """List running processes (pid, name, state), lowest pid first, at most `limit` of them;
        `total` counts them all. Linux only: elsewhere the list is empty and `note` says why.
        """
        return success(await asyncio.to_thread(_processes, limit))

    @tool(kit, READ_ONLY)
    async def disk(
        path: Annotated[str, Field(description="Path relative to the workspace whose filesystem to measure.")] = ".",
    ) -> Annotated[CallToolResult, DiskResult]:
        """Report total, used and free bytes of the filesystem holding a workspace path."""
        try:
            target = contain(ctx.workspace, path)
        except PolicyDenied as exc:
            return failure(exc.code, str(exc))
        try:
            usage = await asyncio.to_thread(shutil.disk_usage, target)
        except FileNotFoundError:
            return failure("tool_error", f"{path!r} does not exist in the workspace; try path '.'")
        except OSError as exc:
            return failure("tool_error", f"cannot measure {path!r}: {exc.strerror or exc}")
        result: dict[str, Any] = {
            "path": target.relative_to(ctx.workspace.resolve()).as_posix() or ".",
            "total_bytes": usage.total,
            "used_bytes": usage.used,
            "free_bytes": usage.free,
        }
        return success(result)

    return kit.server()
