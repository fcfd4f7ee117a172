"""What every built-in toolset gets, and how it reports a failure.

A toolset module exposes `build(ctx: ToolsetContext) -> MCPServer`. The server's tools are
plain names (`run`, `read`); the router prefixes them with the namespace (`shell.run`).

Failures are returned, not raised: `failure(code, message, **details)` makes an MCP result
with `is_error=True` whose structured content carries a stable `code` (SPEC section 4 error
codes: `tool_error`, `invalid_arguments`, `timeout`, `policy_denied`, ...) and a message
written for whoever acts next, often an LLM: what was wrong and what to do instead.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from device_agent.policy import Policy
from device_agent.sandbox import Sandbox


def failure(code: str, message: str, **details: Any) -> CallToolResult:
    """An `is_error` result whose structured content is `{code, message, **details}`."""
    return CallToolResult(
        content=[TextContent(type="text", text=message)],
        structured_content={"code": code, "message": message, **details},
        is_error=True,
    )


def success(data: Mapping[str, Any]) -> CallToolResult:
    """A successful result: `data` as structured content, and as JSON text for plain clients.

    Tools declare `-> Annotated[CallToolResult, SomeTypedDict]`, so one function can return either
    this or a `failure`, and the SDK still publishes (and checks) the output schema.
    """
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False))],
        structured_content=dict(data),
    )


_Fn = TypeVar("_Fn", bound=Callable[..., Any])

# Built-in tools act on this device only, never on an open-ended outside world.
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False)


def action(*, idempotent: bool, destructive: bool) -> ToolAnnotations:
    """Annotations of a tool that changes the device; the engine retries it only if idempotent."""
    return ToolAnnotations(
        read_only_hint=False, idempotent_hint=idempotent, destructive_hint=destructive, open_world_hint=False
    )


def tool(server: MCPServer, annotations: ToolAnnotations, name: str | None = None) -> Callable[[_Fn], _Fn]:
    """Register a structured-output tool whose description is its docstring, dedented for the reader."""

    def register(fn: _Fn) -> _Fn:
        description = inspect.cleandoc(fn.__doc__ or "")
        return server.tool(name=name, description=description, annotations=annotations, structured_output=True)(fn)

    return register


class ProcessTracker:
    """Child processes started by tools, so a cancel can kill them with their process group."""

    def __init__(self) -> None:
        self._procs: set[asyncio.subprocess.Process] = set()
        # Killed by `kill_all`, so the tool can report `cancelled` rather than a crash.
        self._killed: set[asyncio.subprocess.Process] = set()

    def count(self) -> int:
        """How many processes are tracked (running, or exited but not yet discarded)."""
        return len(self._procs)

    def add(self, proc: asyncio.subprocess.Process) -> None:
        self._procs.add(proc)

    def discard(self, proc: asyncio.subprocess.Process) -> None:
        self._procs.discard(proc)
        self._killed.discard(proc)

    def was_killed(self, proc: asyncio.subprocess.Process) -> bool:
        """Whether `kill_all` signalled `proc` (valid until it is discarded)."""
        return proc in self._killed

    def kill_all(self) -> int:
        """SIGKILL every tracked process group; returns how many were signalled."""
        n = 0
        for proc in list(self._procs):
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                    self._killed.add(proc)
                    n += 1
                except (ProcessLookupError, PermissionError):
                    pass
        return n


@dataclass
class ToolsetContext:
    workspace: Path
    policy: Policy
    processes: ProcessTracker = field(default_factory=ProcessTracker)
    data_dir: Path | None = None
    # When set, `shell.run` runs every program inside it (device_agent/sandbox.py).
    sandbox: Sandbox | None = None
