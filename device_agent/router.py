"""Namespaced tool catalogue and the MCP clients that reach each toolset.

Every toolset, built-in or third-party, is an MCP server reached through the official SDK's
`Client`. A `ToolsetHost` owns one client inside one task (the SDK's anyio cancel scopes
require that open and close happen in the same task) and runs calls sent to it through a
queue. A third-party server that dies is restarted; the call it was running fails cleanly.

The built-in toolsets are `MCPServer` objects in the agent's own process. Their tool list still
comes through the client (the catalogue is what any MCP client sees), but their calls go to the
server's own validated entry point directly (`InProcessServer`): no JSON-RPC, no transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx2
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError, UnexpectedResourceError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool as MCPServerTool
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    URL_ELICITATION_REQUIRED,
    CallToolResult,
    ImageContent,
    InputRequiredResult,
    TextContent,
    Tool,
    ToolListChangedNotification,
)
from pydantic import TypeAdapter, ValidationError

from device_agent.approvals import REQUEST_TOOL
from device_agent.audit import AuditLog
from device_agent.guards import Guards
from device_agent.killswitch import HOW_TO_TURN_OFF
from device_agent.mcp_client import ClientFeatures, HttpTarget, OriginBoundHeaders, describe_failure
from device_agent.policy import Policy
from device_agent.stop import StopLatch
from device_agent.toolsets.base import failure, nul_field, nul_message, without_nul
from protocol.errors import MAX_ERROR_MESSAGE_CHARS, RESULT_ERROR_CODES
from protocol.messages import Command, ErrorInfo, Result, ToolAnnotations, ToolSpec

log = logging.getLogger("orrery.agent.router")
# `InProcessServer` logs a tool's failure where the SDK's `tools/call` handler would.
sdk_log = logging.getLogger("mcp.server.mcpserver.server")

# Structured content made JSON-shaped, as the wire would (`TypeAdapter.dump_python(mode="json")`
# without its wrapper's keyword handling, a third of the cost for a small value).
_JSON_SHAPED = TypeAdapter(Any).serializer.to_python
_COMPACT_JSON = TypeAdapter(Any).serializer.to_json  # pydantic's JSON: no spaces, UTF-8, bytes
# `json.dumps(value, default=str)`, which measures a result against the cap, without the encoder
# json.dumps builds for every call it makes with an argument of its own.
_ENCODE = json.JSONEncoder(default=str).encode

MAX_IMAGE_BYTES = 3 * 1024 * 1024  # base64 screenshots pass the result cap up to this, for vision models


Target = MCPServer | StdioServerParameters | HttpTarget


# JSON-RPC errors that answer one call and leave the session as it was: the server refused the
# arguments, or wants a client capability the agent does not declare (sampling; elicitation by
# URL). Any other error (a closed connection, a lost HTTP session) restarts the server.
CALL_ERRORS = frozenset({INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY, URL_ELICITATION_REQUIRED})


class ToolsetUnavailable(Exception):
    pass


# A tool that takes `timeout_s` enforces it itself; the router waits this much longer before it
# gives up on the call, so the tool can kill its processes and return their partial output.
TOOL_TIMEOUT_GRACE_S = 3.0

LimitSource = Literal["command", "argument", "deadline", "device"]


@dataclass(frozen=True)
class CallLimit:
    """How long one command may run, and which setting decided it (every timeout error names it)."""

    seconds: float
    source: LimitSource = "command"

    def describe(self) -> str:
        s = self.seconds
        return {
            "command": f"the command's timeout_s ({s:g} s); raise it if the work needs longer",
            "argument": f"the tool argument timeout_s ({s:g} s); raise it (up to the command's timeout_s)",
            "deadline": f"the batch deadline (the node's timeout_s): {s:g} s were left when the command started",
            "device": f"this device's maximum of {s:g} s per command; split the work into shorter commands",
        }[self.source]


class ToolsetHost:
    """Keeps one MCP client open in a task of its own, restarts it (with backoff) if the server dies,
    and reports changes of its tool list (a restart, or the server's list_changed notification)."""

    def __init__(
        self,
        namespace: str,
        target: Target,
        read_only_tools: frozenset[str] = frozenset(),
        on_change: Callable[[], None] | None = None,
        strict_arguments: bool = False,
        features: ClientFeatures | None = None,
        in_process: bool = False,
    ) -> None:
        self.namespace = namespace
        self.target = target
        # Built-in toolsets (`in_process=True`, an `MCPServer` in this process whose tools take no
        # request `Context`: `toolsets.base.tool` refuses one) are called directly
        # (`InProcessServer`); False sends every call through the SDK client (the equivalence
        # tests compare the two). Third-party servers always go through their client.
        self._in_process = InProcessServer(target) if in_process and isinstance(target, MCPServer) else None
        self.in_process = self._in_process is not None
        # Third-party servers get the client capabilities the agent declares (ClientFeatures);
        # built-in toolsets need none.
        self.features = features
        self.read_only_tools = read_only_tools
        # Built-in toolsets are ours: an argument they do not declare is a caller's mistake, and
        # the SDK would silently drop it (an old `files.write {append: true}` would replace the file).
        self.strict_arguments = strict_arguments
        self.on_change = on_change
        self.tools: list[Tool] = []
        self._catalogue: list[ToolSpec] | None = None  # built from `tools` on first use
        self._by_name: dict[str, ToolSpec] | None = None  # the catalogue by tool name, with it
        self.restarts = 0
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._broken = asyncio.Event()
        self._relist = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._failure: str | None = None
        self._auth: OriginBoundHeaders | None = None  # the HTTP client's, to tell a refused token

    async def start(self, timeout_s: float = 30.0) -> None:
        self._task = asyncio.create_task(self._serve(), name=f"toolset-{self.namespace}")
        async with asyncio.timeout(timeout_s):
            await self._ready.wait()
        if self._client is None and self._failure is not None:
            raise ToolsetUnavailable(f"toolset '{self.namespace}' failed to start: {self._failure}")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stopping = True
        self._broken.set()
        try:
            async with asyncio.timeout(5):
                await self._task
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def call(
        self, tool: str, arguments: dict[str, Any], timeout_s: float, grace_s: float = 0.0
    ) -> CallToolResult:
        """Call a tool from any task (only opening and closing the client are tied to its task).

        The call is abandoned `grace_s` after `timeout_s`: a tool that enforces the limit itself
        gets the grace to kill what it started and return its partial output."""
        if self._in_process is not None:
            return await self._in_process.call(self.namespace, tool, arguments, timeout_s, grace_s)
        client = self._client
        if client is None:
            raise ToolsetUnavailable(f"toolset '{self.namespace}' is not running (it is being restarted)")
        try:
            async with asyncio.timeout(timeout_s + grace_s):
                return await client.call_tool(tool, arguments)
        except TimeoutError:
            return _timed_out(self.namespace, tool, timeout_s)
        except MCPError as exc:
            answer = _call_error(exc, self.namespace, tool, self.target)
            if answer is not None:
                return answer
            failure: Exception = exc
        except Exception as exc:
            failure = exc
        self._broken.set()  # the server died or the session broke: start a fresh one
        reason = describe_failure(failure, self.target, self._auth)
        raise ToolsetUnavailable(f"toolset '{self.namespace}' failed during the call: {reason}") from failure

    async def _serve(self) -> None:
        backoff = 0.5
        while not self._stopping:
            http: httpx2.AsyncClient | None = None
            auth: OriginBoundHeaders | None = None
            try:
                target: Any = self.target
                if isinstance(target, HttpTarget):
                    http, auth = target.client()
                    self._auth = auth
                    target = target.transport(http)
                options = self.features.client_options() if self.features is not None else {}
                async with Client(target, message_handler=self._on_message, **options) as client:
                    self._client = client
                    self._broken.clear()
                    await self._list(client)
                    self._ready.set()
                    backoff = 0.5
                    while not self._broken.is_set():
                        await _first(self._broken.wait(), self._relist.wait())
                        if self._relist.is_set() and not self._broken.is_set():
                            self._relist.clear()
                            await self._list(client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # it could not start, or died under us
                self._failure = describe_failure(exc, self.target, auth)
                log.warning("toolset %s failed (%s); restarting in %.1fs", self.namespace, self._failure, backoff)
            finally:
                self._client = None
                if http is not None:
                    await http.aclose()
            if self._stopping:
                return
            self._ready.set()
            self.restarts += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    def catalogue(self) -> list[ToolSpec]:
        """The tools as catalogue entries; built once per tool list (every call looks its tool up)."""
        if self._catalogue is None:
            self._catalogue = [
                tool_spec(self.namespace, t, t.name in self.read_only_tools, strict=self.strict_arguments)
                for t in self.tools
            ]
        return self._catalogue

    def spec(self, name: str) -> ToolSpec | None:
        """The catalogue entry named `name` (`namespace.tool`), or None (every call asks)."""
        if self._by_name is None:  # reset with the catalogue when the tool list changes
            self._by_name = {t.name: t for t in self.catalogue()}
        return self._by_name.get(name)

    async def _list(self, client: Client) -> None:
        before = self.catalogue()
        self.tools = list((await client.list_tools()).tools)
        self._catalogue = self._by_name = None
        if self._ready.is_set() and self.catalogue() != before and self.on_change is not None:
            self.on_change()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            self._relist.set()
        elif isinstance(message, Exception):  # the transport failed: the server is gone
            self._broken.set()


class InProcessServer:
    """An `MCPServer` hosted in this process (a built-in toolset), called without the MCP transport.

    Why a call here is the same call as through `Client.call_tool` (and fair to compare with one):
    it is the same server object, with the same registered tools, so the same input schemas and
    the same pydantic validation of the arguments (`Tool.run`, which refuses what the schema
    refuses with the same `validation error` text), and the same output-model check of a
    structured result (see `_call_tool`). What it leaves out is only the transport between client
    and server in one process: JSON-RPC framing, the request/response models, the SDK's tracing
    spans and the client's second check of structured content against the output schema the
    server's model already enforced. The outcomes the server's `tools/call` handler
    (`MCPServer._handle_call_tool`) gives are kept: a `ToolError` or any other exception becomes
    an `is_error` text result (logged as the SDK logs it), an `MCPError` is the JSON-RPC error the
    client would raise. Structured content is left as the tool built it: the router makes it
    JSON-shaped (tuples become lists), as the wire would, when it makes the `Result`
    (`Router._convert`). The tool list, the timeout, the grace and the errors they give are the
    router's, the same on both paths; a cancel kills process groups through `ProcessTracker`
    whichever path started them.

    It reaches into three SDK internals (`MCPServer._tool_manager`, `MCPServer._subscriptions`,
    `FuncMetadata._output_adapter`). tests/unit/device_agent/test_in_process_calls.py holds every
    outcome to the SDK's own (through the MCP client, and `MCPServer.call_tool` itself), so an SDK
    release that changes them fails there, not on a device.
    """

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        # The request Context `MCPServer.call_tool` builds for a call made without one. It holds
        # the server and its subscription bus, nothing of the call, and nothing writes to a
        # Context once it is built (mcp/server/mcpserver/context.py sets its fields in `__init__`
        # only), so one built per server is the same to every call as one built per call, which
        # cost a pydantic model per call. Built-in tools never see it anyway (`toolsets.base.tool`
        # refuses a tool that takes one).
        self._context: Context[Any, Any] = Context(mcp_server=server, subscriptions=server._subscriptions)
        # Per tool name: the tool, its output model and the SDK's validator for it (`_output_check`).
        self._outputs: dict[str, tuple[MCPServerTool, Any, Callable[[Any], Any]]] = {}

    async def call(
        self, namespace: str, tool: str, arguments: dict[str, Any], timeout_s: float, grace_s: float = 0.0
    ) -> CallToolResult:
        """Call `tool` under the router's limit; the answer the MCP path gives, as a `CallToolResult`."""
        try:
            async with asyncio.timeout(timeout_s + grace_s):
                raw = await self._call_tool(tool, arguments)
        except TimeoutError:
            return _timed_out(namespace, tool, timeout_s)
        except MCPError as exc:
            answer = _call_error(exc, namespace, tool, self.server)
            if answer is not None:
                return answer
            raise ToolsetUnavailable(f"toolset '{namespace}' failed during the call: {exc}") from exc
        except Exception as exc:  # what `MCPServer._handle_call_tool` turns into an error result
            if isinstance(exc, ToolError) and not isinstance(exc, UnexpectedToolError):
                if isinstance(exc.__cause__, ValidationError):
                    fields = sorted({".".join(str(p) for p in err["loc"]) for err in exc.__cause__.errors()})
                    sdk_log.info("Tool %r rejected arguments: %r", tool, fields)
                else:
                    sdk_log.info("Tool %r failed: %r", tool, str(exc))
            else:
                sdk_log.exception("Tool %r raised an unexpected exception", tool)
            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
        if not isinstance(raw, CallToolResult):  # an input request: built-in tools never ask for input
            return _error("tool_error", f"{namespace}.{tool} asked the client for input, which the agent cannot give")
        return raw

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult | InputRequiredResult:
        """What `MCPServer.call_tool(name, arguments)` returns or raises, for two thirds of its cost.

        The SDK (mcp/server/mcpserver: `MCPServer.call_tool`, `ToolManager.call_tool`, `Tool.run`)
        looks the tool up, runs it with `Tool.run(arguments, context, convert_result=True)`, and
        `convert_result` checks a returned `CallToolResult`'s structured content against the
        tool's output model with an adapter it keeps in a pydantic private attribute. Reading one
        raises and catches AttributeErrors inside pydantic; three reads a call cost ~55K
        instructions, a sixth of a whole router call. Here the tool runs through the same
        `Tool.run` with `convert_result=False` (argument validation, the call and the errors it
        maps are the SDK's), and the conversion `Tool.run` would have made follows, its failures
        mapped as `Tool.run` maps them (`_converted`).
        """
        tool = self.server._tool_manager.get_tool(name)
        if tool is None:
            raise ToolError(f"Unknown tool: {name}")  # as `ToolManager.call_tool` says it
        result = await tool.run(arguments, self._context)
        try:
            return self._converted(tool, result)
        except MCPError:  # `Tool.run`'s handlers, in its order
            raise
        except (UnexpectedToolError, UnexpectedResourceError) as exc:
            raise UnexpectedToolError(f"Error executing tool {tool.name}: {exc}") from exc
        except (ToolError, ResourceError) as exc:
            raise ToolError(f"Error executing tool {tool.name}: {exc}") from exc
        except Exception as exc:
            raise UnexpectedToolError(f"Error executing tool {tool.name}") from exc

    def _converted(self, tool: MCPServerTool, result: Any) -> CallToolResult | InputRequiredResult:
        """`tool.fn_metadata.convert_result(result)`: the check it makes of a `CallToolResult` (the
        output model's, unless the result is an error or the tool publishes no output schema),
        with the validator held in a plain dict; anything else is converted by the SDK itself."""
        meta = tool.fn_metadata
        if not isinstance(result, CallToolResult):
            return meta.convert_result(result)
        model = meta.output_model if meta.output_schema is not None else None
        if model is not None and not result.is_error:
            self._output_check(tool, model)(result.structured_content)
        return result

    def _output_check(self, tool: MCPServerTool, model: Any) -> Callable[[Any], Any]:
        """The SDK's own validator for `model` (`FuncMetadata._output_adapter`), asked for once per
        tool and model: kept while the server holds this tool object with this output model, the
        rule the SDK's own cache follows (its fields are read live: a new model gets a new one)."""
        held = self._outputs.get(tool.name)
        if held is None or held[0] is not tool or held[1] is not model:
            held = self._outputs[tool.name] = (tool, model, tool.fn_metadata._output_adapter(model).validate_python)
        return held[2]


def _timed_out(namespace: str, tool: str, timeout_s: float) -> CallToolResult:
    return _error("timeout", f"{namespace}.{tool} did not finish within {timeout_s:g}s")


def _call_error(exc: MCPError, namespace: str, tool: str, target: Target) -> CallToolResult | None:
    """The result of a call the server answered with a JSON-RPC error (bad arguments, a capability
    the agent does not declare): the call failed, the session is fine, other calls on it go on.
    None for any other error: the server died or the session broke."""
    if exc.code not in CALL_ERRORS:
        return None
    code = "invalid_arguments" if exc.code == INVALID_PARAMS else "tool_error"
    return _error(code, f"{namespace}.{tool}: {describe_failure(exc, target, None)}")


async def _first(*waits: Any) -> None:
    """Return when the first of `waits` finishes; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


def tool_spec(namespace: str, tool: Tool, force_read_only: bool = False, strict: bool = False) -> ToolSpec:
    """MCP tool -> catalogue entry. MCP's hint defaults: not read-only, destructive, not idempotent.

    `strict`: the router refuses arguments the schema does not declare (built-in toolsets), and
    the schema says so (`additionalProperties: false`), so the server can refuse them at submission."""
    ann = tool.annotations
    schema = dict(tool.input_schema or {})
    if strict and isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    if strict:  # the router refuses NUL bytes in them too (`nul_field`): say so, for submission
        schema = without_nul(f"{namespace}.{tool.name}", schema)
    read_only = force_read_only or bool(ann and ann.read_only_hint)
    idempotent = bool(ann and ann.idempotent_hint) or read_only
    destructive = (not read_only) and (ann is None or ann.destructive_hint is not False)
    return ToolSpec(
        name=f"{namespace}.{tool.name}",
        namespace=namespace,
        description=tool.description or "",
        input_schema=schema,
        annotations=ToolAnnotations(read_only=read_only, idempotent=idempotent, destructive=destructive),
        tool_type="data_collection" if read_only else "action",
    )


class Router:
    """Routes `namespace.tool` commands to toolset hosts, applying the device policy."""

    def __init__(
        self,
        policy: Policy,
        audit: AuditLog,
        approval_required: list[str],
        max_result_bytes: int,
        on_kill: Callable[[], int] = lambda: 0,
        guards: Guards | None = None,
        stop_latch: StopLatch | None = None,
    ) -> None:
        self.policy = policy
        self.stop_latch = stop_latch or StopLatch()
        self.audit = audit
        # issue 18: run-time kill switch, safety budgets, audit line before the call
        self.guards = guards or Guards(audit)
        self.approval_required = tuple(approval_required)  # fixed for the agent's life (answers are cached)
        self._asks: dict[str, bool] = {}  # needs_approval's answer per tool (the patterns never change)
        self.max_result_bytes = max_result_bytes
        self.hosts: dict[str, ToolsetHost] = {}
        self.kill_running = on_kill
        self.on_tools_changed: Callable[[], None] | None = None  # the agent sends `tools_changed`

    def tools_changed(self) -> None:
        if self.on_tools_changed is not None:
            self.on_tools_changed()

    def add(self, host: ToolsetHost) -> None:
        if host.namespace in self.hosts:
            raise ValueError(
                f"toolset namespace '{host.namespace}' is configured twice; give each MCP server its own namespace"
            )
        self.hosts[host.namespace] = host

    async def start(self) -> None:
        for host in self.hosts.values():
            try:
                await host.start()
            except (ToolsetUnavailable, TimeoutError) as exc:
                log.error("%s", exc)
        names = [t.name for h in self.hosts.values() for t in h.catalogue()]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate tool names: {sorted(dupes)}")

    async def stop(self) -> None:
        for host in self.hosts.values():
            await host.stop()

    def catalogue(self) -> list[ToolSpec]:
        return [spec for host in self.hosts.values() for spec in host.catalogue()]

    def needs_approval(self, tool: str) -> bool:
        """Whether `tool` waits for a person's approval before it runs (`device_agent.approvals`):
        `approval.request` always; a tool on `approval_required` unless the agent runs unattended."""
        if tool == REQUEST_TOOL:
            return True
        if self.policy.unattended:
            return False
        asks = self._asks.get(tool)
        if asks is None:  # patterns matched once per tool (asked twice for every command)
            asks = self._asks[tool] = any(fnmatch.fnmatch(tool, p) for p in self.approval_required)
        return asks

    def read_only(self, tool: str) -> bool:
        """Whether `tool` is a read-only tool of this device (unknown tools are not)."""
        host = self.hosts.get(tool.partition(".")[0])
        spec = host.spec(tool) if host else None
        return spec is not None and spec.annotations.read_only

    async def call(self, cmd: Command, batch_id: str, limit: CallLimit | float, approved: bool = False) -> Result:
        """Run `cmd` under `limit` (the command's timeout_s, or less if the batch deadline is nearer).
        `approved`: the caller holds a recorded approval for it (a tool that needs one is refused
        without it).

        A tool whose input schema has a `timeout_s` property runs under the limit itself: it is
        passed when the call did not give one, and an explicit one above the limit is lowered to it.
        """
        started = time.monotonic_ns()
        if not isinstance(limit, CallLimit):
            limit = CallLimit(float(limit))
        if limit.seconds > self.policy.max_timeout_s:
            limit = CallLimit(self.policy.max_timeout_s, "device")
        namespace, _, name = cmd.tool.partition(".")
        host = self.hosts.get(namespace)
        spec = host.spec(cmd.tool) if host else None
        audit = {"batch_id": batch_id, "call_id": cmd.call_id, "tool": cmd.tool}
        if host is None or spec is None:
            known = ", ".join(sorted(t.name for h in self.hosts.values() for t in h.catalogue())[:40])
            return self._finish(
                cmd,
                namespace,
                started,
                audit,
                "denied",
                _error("unknown_tool", f"this device has no tool '{cmd.tool}'; it has: {known}"),
            )
        nul = nul_field(cmd.tool, cmd.arguments) if host.strict_arguments else None
        if nul is not None:  # checked before anything else looks at the strings (issue 14, item 1)
            return self._finish(
                cmd,
                namespace,
                started,
                audit,
                "denied",
                failure("invalid_arguments", nul_message(cmd.tool, nul), field=nul),
            )
        unknown = _undeclared(cmd.arguments, spec) if host.strict_arguments else []
        if unknown:
            return self._finish(
                cmd,
                namespace,
                started,
                audit,
                "denied",
                _error("invalid_arguments", _undeclared_message(spec, unknown)),
            )
        if self.stop_latch.stopped and not spec.annotations.read_only:
            refusal = _error("device_stopped", self.stop_latch.refusal(cmd.tool))
            return self._finish(cmd, namespace, started, audit, "denied", refusal)
        denial = self._policy_denial(cmd.tool, spec, approved)
        if denial:
            return self._finish(cmd, namespace, started, audit, "denied", _error("policy_denied", denial))
        refused = self.guards.before(audit, spec)
        if refused is not None:
            return self._finish(cmd, namespace, started, audit, "denied", _error(*refused))
        arguments, limit, enforced = with_timeout(spec, cmd.arguments, limit)
        try:
            raw = await host.call(name, arguments, limit.seconds, TOOL_TIMEOUT_GRACE_S if enforced else 0.0)
        except ToolsetUnavailable as exc:
            raw = _error("tool_error", f"{exc}; the toolset is being restarted, so the call may be retried")
        return self._finish(cmd, namespace, started, audit, "allowed", _name_limit(raw, limit))

    def refused_now(self, cmd: Command, batch_id: str) -> Result | None:
        """The refusal of `cmd` that no decision could change (the emergency stop, the kill switch,
        a breached safety budget), so that nobody is asked to approve a command that would be
        refused anyway; None if there is none now (the call's own checks still run later)."""
        namespace = cmd.tool.partition(".")[0]
        host = self.hosts.get(namespace)
        spec = host.spec(cmd.tool) if host else None
        if spec is None:
            return None
        ann = spec.annotations
        refusal: CallToolResult | None = None
        if self.stop_latch.stopped and not ann.read_only:
            refusal = _error("device_stopped", self.stop_latch.refusal(cmd.tool))
        elif self._kill_switch_refuses(spec):
            refusal = _error("policy_denied", _kill_switch_message(cmd.tool))
        elif (breach := self.guards.budgets.refusal(ann.read_only, ann.destructive)) is not None:
            refusal = _error("budget_exceeded", breach.refusal(spec.name))
        if refusal is None:
            return None
        audit = {"batch_id": batch_id, "call_id": cmd.call_id, "tool": cmd.tool}
        return self._finish(cmd, namespace, time.monotonic_ns(), audit, "denied", refusal)

    def _kill_switch_refuses(self, spec: ToolSpec) -> bool:
        harmless = spec.annotations.read_only or (spec.annotations.idempotent and not spec.annotations.destructive)
        # A harmless tool runs whatever the switch says: its file is looked at only for the others.
        return not harmless and (self.policy.kill_switch or self.guards.kill_switch_on())

    def _policy_denial(self, tool: str, spec: ToolSpec, approved: bool) -> str | None:
        if self._kill_switch_refuses(spec):
            return _kill_switch_message(tool)
        if not approved and self.needs_approval(tool):
            return f"'{tool}' needs a person's approval before it runs, and none was given for this call"
        return None

    def _finish(
        self, cmd: Command, namespace: str, started: int, audit: dict[str, Any], decision: str, raw: CallToolResult
    ) -> Result:
        duration = (time.monotonic_ns() - started + 500) // 1000 / 1000  # ms to the µs, without rounding a float
        result = self._convert(cmd.call_id, namespace, raw, duration)
        self.guards.after(audit, decision, result)
        return result

    def _convert(self, call_id: str, namespace: str, raw: CallToolResult, duration_ms: float) -> Result:
        # Structured content as the wire carries it (tuples become lists, ...): a built-in tool
        # called in process hands over what it built. Shaped here, for both paths, so that the
        # result is not copied to hold the shaped content.
        content = None if raw.structured_content is None else _JSON_SHAPED(raw.structured_content, mode="json")
        if raw.is_error:
            return self._failure(call_id, namespace, raw, content or {}, duration_ms)
        value = self._cap(content if content is not None else _value(raw))
        images = result_images(raw)
        if images and isinstance(value, dict):
            value = {**value, "images": images}
        return Result(call_id=call_id, status="success", result=value, namespace=namespace, duration_ms=duration_ms)

    def _failure(
        self, call_id: str, namespace: str, raw: CallToolResult, detail: dict[str, Any], duration_ms: float
    ) -> Result:
        message = str(detail.get("message") or _text(raw) or "the tool failed")
        # The SDK reports arguments that fail the input schema as untyped error text.
        default = "invalid_arguments" if "validation error" in message else "tool_error"
        code = str(detail.get("code") or default)
        extra = {k: v for k, v in detail.items() if k not in ("code", "message")}
        return Result(
            call_id=call_id,
            status="uncertain" if code == "uncertain" else "failure",
            result=self._cap(extra) if extra else None,
            error=ErrorInfo(
                code=code if code in RESULT_ERROR_CODES else "tool_error", message=message[:MAX_ERROR_MESSAGE_CHARS]
            ),
            namespace=namespace,
            duration_ms=duration_ms,
        )

    def _cap(self, value: Any) -> Any:
        """SPEC section 5 output caps: oversized results are truncated with a marker, never dropped.

        `value` is JSON-shaped (structured content shaped by `_JSON_SHAPED`, or text parts)."""
        if _certainly_fits(value, self.max_result_bytes):
            return value
        encoded = _ENCODE(value)
        size = len(encoded)
        if size <= self.max_result_bytes:
            return value
        text = value if isinstance(value, str) else encoded
        keep = self.max_result_bytes // 2
        return {"truncated": True, "original_bytes": size, "preview": text[:keep]}


def _certainly_fits(value: Any, limit: int) -> bool:
    """Whether the cap's measure of a JSON-shaped `value` (its `json.dumps` length) is certainly
    within `limit`, told from pydantic's compact JSON of it for a quarter of the measure's cost.

    json.dumps writes at most 6 characters for each byte of that JSON: `\\u007f` for a DEL,
    `\\uXXXX` for a 2- or 3-byte character (a surrogate pair for a 4-byte one), `, ` and `: ` for
    `,` and `:`, `Infinity` for `null`, a float's exponent a character longer (`1e-07` for
    `1e-7`); every other escape, number and literal alike (tests/unit/device_agent/
    test_result_cap.py checks the bound). False means: measure it.
    """
    try:
        return 6 * len(_COMPACT_JSON(value)) <= limit
    except ValueError:  # text UTF-8 cannot hold (a lone surrogate)
        return False


def with_timeout(spec: ToolSpec, arguments: dict[str, Any], limit: CallLimit) -> tuple[dict[str, Any], CallLimit, bool]:
    """The arguments to send, the limit the call runs under, and whether the tool enforces it.

    A tool that declares `timeout_s` gets the limit as that argument unless the call gave a
    smaller one (then that is the limit); a value the tool would refuse anyway is left to it.
    """
    prop = (spec.input_schema.get("properties") or {}).get("timeout_s")
    if not isinstance(prop, dict):
        return arguments, limit, False
    given = arguments.get("timeout_s")
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int | float) or given <= 0:
            return arguments, limit, True  # not a valid limit: the tool's own validation says so
        if given < limit.seconds:
            return arguments, CallLimit(float(given), "argument"), True
    value: float | int = limit.seconds
    if "integer" in _types(prop) and "number" not in _types(prop):
        value = max(1, math.floor(limit.seconds))
    return {**arguments, "timeout_s": value}, limit, True


def _types(schema: dict[str, Any]) -> set[str]:
    kinds = schema.get("type")
    found = {kinds} if isinstance(kinds, str) else set(kinds or [])
    for branch in schema.get("anyOf") or schema.get("oneOf") or []:
        if isinstance(branch, dict):
            found |= _types(branch)
    return found


def _name_limit(raw: CallToolResult, limit: CallLimit) -> CallToolResult:
    """A timeout error says which limit was hit (the command's, the argument's, the deadline, the device's)."""
    detail = raw.structured_content if isinstance(raw.structured_content, dict) else None
    if not raw.is_error or detail is None or detail.get("code") != "timeout":
        return raw
    message = f"{detail.get('message') or _text(raw) or 'the tool timed out'}; limit hit: {limit.describe()}"
    return CallToolResult(
        content=[TextContent(type="text", text=message)],
        structured_content={**detail, "message": message, "limit": limit.source, "limit_s": limit.seconds},
        is_error=True,
    )


# Arguments that moved to a tool of their own, so the message can point the caller there.
MOVED_ARGUMENTS = {("files.write", "append"): "to add to the end of a file use files.append"}


def _undeclared(arguments: dict[str, Any], spec: ToolSpec) -> list[str]:
    declared = spec.input_schema.get("properties") or {}
    if arguments.keys() <= declared.keys():  # the usual answer, without a loop in Python
        return []
    return sorted(k for k in arguments if k not in declared)


def _undeclared_message(spec: ToolSpec, unknown: list[str]) -> str:
    declared = sorted(spec.input_schema.get("properties") or {})
    hints = [MOVED_ARGUMENTS[(spec.name, k)] for k in unknown if (spec.name, k) in MOVED_ARGUMENTS]
    return (
        f"{spec.name} has no argument {', '.join(repr(k) for k in unknown)}; its arguments are "
        f"{', '.join(declared) or 'none'}" + "".join(f"; {h}" for h in hints)
    )


def _error(code: str, message: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=message)],
        structured_content={"code": code, "message": message},
        is_error=True,
    )


def _text(raw: CallToolResult) -> str:
    return "\n".join(c.text for c in raw.content if isinstance(c, TextContent))


def result_images(raw: CallToolResult) -> list[dict[str, Any]]:
    """Image parts of a structured result, kept out of the text cap (a model may need to see them)."""
    if raw.structured_content is None or raw.is_error:
        return []
    images = [c for c in raw.content if isinstance(c, ImageContent)]
    # Over the cap, the newest images win: a tool lists its most useful one last (the gui
    # toolset's marked screenshot comes after the plain one), and a model is shown the last.
    out: list[dict[str, Any]] = []
    total = 0
    for c in reversed(images):
        total += len(c.data)
        if total > MAX_IMAGE_BYTES:
            out.append({"type": "image", "mime_type": c.mime_type, "omitted": f"over {MAX_IMAGE_BYTES} bytes"})
        else:
            out.append({"type": "image", "mime_type": c.mime_type, "data": c.data})
    return out[::-1]


def _value(raw: CallToolResult) -> Any:
    """The result of a tool without structured content: its text; images as base64 parts."""
    parts: list[Any] = []
    for c in raw.content:
        if isinstance(c, TextContent):
            parts.append(c.text)
        elif isinstance(c, ImageContent):
            parts.append({"type": "image", "mime_type": c.mime_type, "data": c.data})
        else:
            parts.append(c.model_dump(mode="json"))
    if len(parts) == 1 and isinstance(parts[0], str):
        return parts[0]
    return parts or None


__all__ = ["CallLimit", "Router", "ToolsetHost"]


def _kill_switch_message(tool: str) -> str:
    return (
        f"the device owner has switched off action tools (kill switch), so '{tool}' is refused; "
        f"only read-only tools may run until {HOW_TO_TURN_OFF}"
    )
