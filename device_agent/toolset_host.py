"""Toolset hosts: how the agent reaches each toolset's MCP server (SPEC section 5).

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
import logging
import sys
from collections.abc import Callable
from typing import Any, is_typeddict

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
    InputRequiredResult,
    TextContent,
    Tool,
    ToolListChangedNotification,
)
from pydantic import TypeAdapter, ValidationError

from device_agent.mcp_client import ClientFeatures, HttpTarget, OriginBoundHeaders, describe_failure
from device_agent.toolsets.base import in_process_tools, without_nul
from protocol.messages import ToolAnnotations, ToolSpec

log = logging.getLogger("orrery.agent.router")
# `InProcessServer` logs a tool's failure where the SDK's `tools/call` handler would.
sdk_log = logging.getLogger("mcp.server.mcpserver.server")


Target = MCPServer | StdioServerParameters | HttpTarget


# JSON-RPC errors that answer one call and leave the session as it was: the server refused the
# arguments, or wants a client capability the agent does not declare (sampling; elicitation by
# URL). Any other error (a closed connection, a lost HTTP session) restarts the server.
CALL_ERRORS = frozenset({INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY, URL_ELICITATION_REQUIRED})


class ToolsetUnavailable(Exception):
    pass


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
        hidden_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.namespace = namespace
        # Tools the agent calls itself (the live view's) and never lists for tasks: not in the
        # catalogue, so the router refuses a command naming one as an unknown tool.
        self.hidden_tools = hidden_tools
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
                if t.name not in self.hidden_tools
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

    The tools it calls are the objects the server itself serves: a `Toolkit` (toolsets.base)
    built them with the SDK's public `Tool.from_function` and gave them to the server it built
    (`in_process_tools`). A server no Toolkit built, and a tool that takes a request Context or
    resolves parameters, get the SDK's public `MCPServer.call_tool` instead.
    tests/unit/device_agent/test_in_process_calls.py holds every outcome to the SDK's own
    (through the MCP client, and `MCPServer.call_tool` itself), so an SDK release that changes
    them fails there.
    """

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.tools = in_process_tools(server)
        self.fast = self.tools is not None
        # The request Context a direct call runs under. The tools called directly take none
        # (`_call_tool` sends those that do to `MCPServer.call_tool`), so it only has to exist:
        # one built per server, not a pydantic model per call.
        self._context: Context[Any, Any] = Context(mcp_server=server)
        # Per tool name: the tool, its output model and a validator for it (`_output_check`).
        self._outputs: dict[str, tuple[MCPServerTool, Any, Callable[[Any], Any] | None]] = {}

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
            return error_result(
                "tool_error", f"{namespace}.{tool} asked the client for input, which the agent cannot give"
            )
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
        tool = self.tools.get(name) if self.tools is not None else None
        if tool is None or tool.context_kwarg is not None or tool.resolved_params:
            return await self.server.call_tool(name, arguments)  # the SDK's own entry point
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
        with a validator held in a plain dict; anything else is converted by the SDK itself."""
        meta = tool.fn_metadata
        if not isinstance(result, CallToolResult):
            return meta.convert_result(result)
        model = meta.output_model if meta.output_schema is not None else None
        if model is not None and not result.is_error:
            check = self._output_check(tool, model)
            if check is None:
                return meta.convert_result(result)
            check(result.structured_content)
        return result

    def _output_check(self, tool: MCPServerTool, model: Any) -> Callable[[Any], Any] | None:
        """A validator for `model`, made once per tool and model (the tool's fields are read live:
        a new model gets a new one). It is pydantic's `TypeAdapter(model)`, which the SDK builds
        too; None where the SDK would first rebuild the model (a `typing.TypedDict` below Python
        3.12, which pydantic refuses), for which the SDK converts the result itself."""
        held = self._outputs.get(tool.name)
        if held is None or held[0] is not tool or held[1] is not model:
            check: Callable[[Any], Any] | None = None
            if sys.version_info >= (3, 12) or not is_typeddict(model) or type(model).__module__ != "typing":
                check = TypeAdapter(model).validate_python
            held = self._outputs[tool.name] = (tool, model, check)
        return held[2]


def _timed_out(namespace: str, tool: str, timeout_s: float) -> CallToolResult:
    return error_result("timeout", f"{namespace}.{tool} did not finish within {timeout_s:g}s")


def _call_error(exc: MCPError, namespace: str, tool: str, target: Target) -> CallToolResult | None:
    """The result of a call the server answered with a JSON-RPC error (bad arguments, a capability
    the agent does not declare): the call failed, the session is fine, other calls on it go on.
    None for any other error: the server died or the session broke."""
    if exc.code not in CALL_ERRORS:
        return None
    code = "invalid_arguments" if exc.code == INVALID_PARAMS else "tool_error"
    return error_result(code, f"{namespace}.{tool}: {describe_failure(exc, target, None)}")


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


def error_result(code: str, message: str) -> CallToolResult:
    """A failed call's result, as a tool reports one: the code and message, as text and structured."""
    return CallToolResult(
        content=[TextContent(type="text", text=message)],
        structured_content={"code": code, "message": message},
        is_error=True,
    )
