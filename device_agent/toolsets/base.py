"""What every built-in toolset gets, and how it reports a failure.

A toolset module exposes `build(ctx: ToolsetContext) -> MCPServer`, a server its `Toolkit` built
(`Toolkit.server`). The server's tools are plain names (`run`, `read`); the router prefixes them
with the namespace (`shell.run`).

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
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from device_agent.orphans import MARK_VAR
from device_agent.orphans import preexec as orphans_preexec
from device_agent.policy import Policy
from device_agent.sandbox import Sandbox
from device_agent.stop import StopLatch
from device_agent.takeover import Takeover
from device_agent.transfer import ArtifactLink
from protocol.messages import CommandBatch


def failure(code: str, message: str, **details: Any) -> CallToolResult:
    """An `is_error` result whose structured content is `{code, message, **details}`."""
    return CallToolResult(
        content=[TextContent(type="text", text=message)],
        structured_content={"code": code, "message": message, **details},
        is_error=True,
    )


# `json.dumps(data, ensure_ascii=False)` without the encoder json.dumps builds for every call it
# makes with an argument of its own (every successful call of a built-in tool makes one).
_TEXT = json.JSONEncoder(ensure_ascii=False).encode


def success(data: Mapping[str, Any]) -> CallToolResult:
    """A successful result: `data` as structured content, and as JSON text for plain clients.

    Tools declare `-> Annotated[CallToolResult, SomeTypedDict]`, so one function can return either
    this or a `failure`, and the SDK still publishes (and checks) the output schema.
    """
    return CallToolResult(
        content=[TextContent(type="text", text=_TEXT(data))],
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


class Toolkit:
    """The tools of one built-in toolset, and the MCP server that serves them (`server()`).

    Each tool is built once, by the SDK's public `Tool.from_function`, and the server is given
    those very objects (`MCPServer(tools=...)`). The agent calls built-in tools in process
    (`toolset_host.InProcessServer`) through the same objects, found with `in_process_tools`:
    one definition, one validation, whichever path a call takes. A toolkit's tool list is fixed
    once its server is built.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.tools: list[Tool] = []

    def add(self, fn: Callable[..., Any], **options: Any) -> Tool:
        """Add `fn` as a tool (`options` as `Tool.from_function` takes them); a name twice is a mistake."""
        made = Tool.from_function(fn, **options)
        if any(t.name == made.name for t in self.tools):
            raise ValueError(f"toolset {self.name} has two tools named {made.name}")
        self.tools.append(made)
        return made

    def server(self, **options: Any) -> MCPServer:
        """The toolset's MCP server (`options` as `MCPServer` takes them), serving this toolkit's tools."""
        server: MCPServer = MCPServer(self.name, tools=list(self.tools), **options)
        _SERVED[server] = {t.name: t for t in self.tools}
        return server


# Every server a Toolkit built, with the tool objects it serves by name.
_SERVED: weakref.WeakKeyDictionary[MCPServer, Mapping[str, Tool]] = weakref.WeakKeyDictionary()


def in_process_tools(server: MCPServer) -> Mapping[str, Tool] | None:
    """The tool objects `server` serves, by name, if a `Toolkit` built it; else None."""
    return _SERVED.get(server)


def tool(kit: Toolkit, annotations: ToolAnnotations, name: str | None = None) -> Callable[[_Fn], _Fn]:
    """Register a structured-output tool whose description is its docstring, dedented for the reader."""

    def register(fn: _Fn) -> _Fn:
        if find_context_parameter(fn) is not None:
            # The agent calls built-in tools in process (`router.call_in_process`), outside any
            # client session: a request Context (roots, sampling, progress) would not work there.
            raise TypeError(
                f"built-in tool {fn.__name__} takes a request Context; built-in tools are called in process"
            )
        description = inspect.cleandoc(fn.__doc__ or "")
        kit.add(fn, name=name, description=description, annotations=annotations, structured_output=True)
        return fn

    return register


class ProcessWatcher(Protocol):
    """Told of the process groups tools start, so that they are found again if the agent dies
    while they run (device_agent/orphans.py `Recorder`, which keeps them in the ledger)."""

    def mark(self) -> str:
        """The value of `MARK_VAR` for what is started now: it names the agent and the call."""
        ...

    def spawned(self, pid: int) -> None:
        """A process group was started (`pid` leads it); may raise if it cannot be recorded."""
        ...

    def reaped(self, pid: int) -> None:
        """The group's leader was reaped (and its group killed, if it outlived it)."""
        ...


class ProcessTracker:
    """Child processes started by tools, so a cancel can kill them with their process group.

    Tools start their processes with `environment` and `preexec` and report them with
    `add` and `discard`: the program then dies with the agent, and with a `watcher` (the agent
    sets one) the group is recorded, so the next agent kills what this one leaves running."""

    def __init__(self) -> None:
        self._procs: set[asyncio.subprocess.Process] = set()
        # Killed by `kill_all`, so the tool can report `cancelled` rather than a crash.
        self._killed: set[asyncio.subprocess.Process] = set()
        self.watcher: ProcessWatcher | None = None

    def count(self) -> int:
        """How many processes are tracked (running, or exited but not yet discarded)."""
        return len(self._procs)

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """`env`, with the watcher's mark added, for a process a tool starts now: every process
        it starts in turn inherits the mark (found even if it leaves the group, device_agent/orphans.py)."""
        if self.watcher is not None:
            env[MARK_VAR] = self.watcher.mark()
        return env

    @staticmethod
    def preexec() -> Callable[[], None] | None:
        """The `preexec_fn` of a process a tool starts: the kernel kills it when the agent dies."""
        return orphans_preexec()

    def add(self, proc: asyncio.subprocess.Process) -> None:
        """Track `proc`, the leader of a process group a tool started. If the watcher cannot record
        it, the group is killed (it must not run unrecorded) and the error raised."""
        self._procs.add(proc)
        if self.watcher is not None:
            try:
                self.watcher.spawned(proc.pid)
            except BaseException:
                self._kill(proc)
                raise

    def discard(self, proc: asyncio.subprocess.Process) -> None:
        if proc in self._procs and self.watcher is not None:
            self.watcher.reaped(proc.pid)
        self._procs.discard(proc)
        self._killed.discard(proc)

    def was_killed(self, proc: asyncio.subprocess.Process) -> bool:
        """Whether `kill_all` signalled `proc` (valid until it is discarded)."""
        return proc in self._killed

    def kill_all(self) -> int:
        """SIGKILL every tracked process group; returns how many were signalled."""
        return sum(self._kill(proc) for proc in list(self._procs))

    def _kill(self, proc: asyncio.subprocess.Process) -> bool:
        if proc.returncode is not None:
            return False
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return False
        self._killed.add(proc)
        return True


# ---------------------------------------------------------------- NUL bytes

NUL = "\x00"
# A string without NUL, as a JSON Schema `pattern` (ECMA-262 and Python `re` read it alike).
NO_NUL_PATTERN = "^[^\\x00]*$"
# Arguments of built-in tools that are data for the tool (written to a file or a pipe as bytes),
# never a C string handed to the OS: a NUL in them is content, kept as sent. Every other string
# of a built-in tool's arguments, and every key, is refused if it holds a NUL (see `nul_field`).
NUL_IS_DATA: Mapping[str, frozenset[str]] = {
    "files.write": frozenset({"content"}),
    "files.append": frozenset({"content"}),
    "shell.run": frozenset({"stdin"}),
    "system.echo": frozenset({"text"}),
}


def nul_field(tool: str, arguments: Mapping[str, Any]) -> str | None:
    """The first argument of `tool` holding a NUL byte, named as a caller writes it (`argv[0]`,
    `env.PATH`, `path`), or None.

    The OS cuts a string at its first NUL: uvloop's process spawn passes `"rm\0x"` as `rm` (past a
    deny list that saw `rm\0x`) and `"keep\0DROPPED"` as `keep`. No program argument, path,
    working directory or environment entry can hold one, so the whole call is refused, before
    anything runs, whatever the string is used for. Keys are checked too (`env` names)."""
    data = NUL_IS_DATA.get(tool, frozenset())
    for key, value in arguments.items():
        if key in data and NUL not in key:
            continue
        found = next(_nul_paths(value, key, str(key)), None)
        if found is not None:
            return found
    return None


def _nul_paths(value: Any, key: str, path: str) -> Iterator[str]:
    if NUL in key:
        yield f"{_shown(path)} (its name)"
    elif isinstance(value, str):
        if NUL in value:
            yield _shown(path)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _nul_paths(v, str(k), f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _nul_paths(v, "", f"{path}[{i}]")


def _shown(path: str) -> str:
    return path.replace(NUL, "\\0")


def nul_message(tool: str, field: str) -> str:
    return (
        f"argument {field} contains a NUL byte (U+0000); {tool} refuses it before anything runs, "
        "because the OS would cut the value short there (a program name, argument, path or "
        "environment entry cannot hold one); remove the NUL and send the call again"
    )


def without_nul(tool: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` (a built-in tool's input schema) with `pattern: NO_NUL_PATTERN` on every string that
    `nul_field` checks, so the server refuses a NUL at submission (the device still checks)."""
    data = NUL_IS_DATA.get(tool, frozenset())
    out = dict(schema)
    props = schema.get("properties")
    if isinstance(props, Mapping):
        out["properties"] = {k: v if k in data else _no_nul(v) for k, v in props.items()}
    for key in ("$defs", "definitions"):
        defs = schema.get(key)
        if isinstance(defs, Mapping):
            out[key] = {k: _no_nul(v) for k, v in defs.items()}
    return out


def _no_nul(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_no_nul(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: _no_nul(v) if k in _SUBSCHEMAS else v for k, v in schema.items()}
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(schema.get(key), Mapping):
            out[key] = {k: _no_nul(v) for k, v in schema[key].items()}
    kinds = schema.get("type")
    if (kinds == "string" or (isinstance(kinds, list) and "string" in kinds)) and "pattern" not in schema:
        out["pattern"] = NO_NUL_PATTERN
    if (kinds == "object" or "properties" in schema) and "propertyNames" not in schema:
        out["propertyNames"] = {"pattern": NO_NUL_PATTERN}
    return out


# Where a value's own schema sits (not `not`, `if` or `contains`: a pattern there would not refuse).
_SUBSCHEMAS = frozenset({"items", "prefixItems", "additionalProperties", "anyOf", "oneOf", "allOf", "then", "else"})


@dataclass
class ToolsetContext:
    workspace: Path
    policy: Policy
    processes: ProcessTracker = field(default_factory=ProcessTracker)
    data_dir: Path | None = None
    # When set, `shell.run` runs every program inside it (device_agent/sandbox.py).
    sandbox: Sandbox | None = None
    # The device-level emergency stop: toolsets with input of their own (gui) register with it.
    stop_latch: StopLatch = field(default_factory=StopLatch)
    # Who has the screen (a person's takeover): input toolsets void their observation on a change.
    takeover: Takeover = field(default_factory=Takeover)
    # Artifacts: how to reach the orchestrator's artifact routes, and the batch the
    # agent runs now (the artifact tools act for it; set by the runner once the agent exists).
    artifacts: ArtifactLink | None = None
    current_batch: Callable[[], CommandBatch | None] = lambda: None
