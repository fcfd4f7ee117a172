"""Orrery as an MCP server: the fleet's tools for AI assistants (any MCP host), over the REST API.

Every tool is a call of the Python SDK (`orrery.sdk.AsyncClient`) with the caller's own API key,
so an assistant can do exactly what that key may do through the REST API: a viewer's key lists
and watches, an operator's submits, cancels and decides approvals (SPEC section 3, roles). The
same server object is served two ways (docs/how-to/mcp-server.md):

- Streamable HTTP at `/mcp` on the orchestrator's own port (`orchestrator/mcp_endpoint.py`): the
  key is the request's bearer token, and the SDK reaches the API in process;
- `orrery mcp` on stdio, for a host that starts a local process: the key and server are found
  as the CLI finds them, and the SDK reaches the API over the network.

A refusal comes back as a tool error a model can act on: after the MCP SDK's `Error executing
tool <name>: `, the API's stable code and detail (`<code>: <detail>`, docs/reference/error-codes.md),
then each problem of a refused DAG on a line of its own (`- <code>: <message>`).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import ToolAnnotations
from pydantic import Field

from orrery.sdk import AsyncClient, NotFound, OrreryError
from orrery.sdk.models import Device, Task

ClientFor = Callable[[Context], AbstractAsyncContextManager[AsyncClient]]

INSTRUCTIONS = """Orrery runs one task across many devices: a DAG of tool calls (nodes), each placed
on a device that can do it. Start with list_devices (what exists, and each device's tools), then
validate_task before submit_task, then wait_for_task. A node may wait for a person's approval:
list_approvals and decide_approval (operator keys only). Errors start with a stable code."""

READ = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
RUNS = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False, openWorldHint=True)
CHANGES = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False)
WAIT_STEP_S = 0.5  # how often a wait reads the task again (and reports progress)
MAX_WAIT_S = 600.0
TEXT_LIMIT = 256 * 1024  # an artifact up to this size comes back as text, if it is text

DagArg = Annotated[
    dict[str, Any] | None,
    Field(description="a DAG as the REST API takes it: {nodes: [...], edges: [...]} (see the DAG reference)"),
]
RequestArg = Annotated[str | None, Field(description="instead of a DAG: what to do, in plain words, for the planner")]


def build_server(client_for: ClientFor, version: str = "") -> MCPServer:
    """The MCP server; `client_for(ctx)` opens the SDK client to use for one call."""
    # MCPServer's constructor calls `logging.basicConfig` (a rich handler at INFO on the root
    # logger): in a process that has not set up its logging yet (`orrery demo`, `orrery mcp`)
    # every library's INFO lines would then print. A handler in place for the moment makes that
    # call do nothing; the process's own setup (or Python's default: warnings and up) stands.
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        server = MCPServer("orrery", title="Orrery", instructions=INSTRUCTIONS, version=version)
    finally:
        root.removeHandler(placeholder)

    def api(ctx: Context) -> AbstractAsyncContextManager[AsyncClient]:
        return _client(client_for, ctx, ToolError)

    @server.tool(annotations=READ)
    async def list_devices(ctx: Context) -> list[dict[str, Any]]:
        """Every device: id, name, state, labels, platform, the names of its tools, and what it runs now."""
        async with api(ctx) as client:
            return [_device_summary(d) for d in await client.devices()]

    @server.tool(annotations=READ)
    async def describe_device(
        ctx: Context, device: Annotated[str, Field(description="a device's id, unique id prefix or name")]
    ) -> dict[str, Any]:
        """One device with its whole tool catalogue: each tool's description and input schema."""
        async with api(ctx) as client:
            return (await client.device(device)).model_dump(mode="json")

    @server.tool(annotations=READ)
    async def validate_task(
        ctx: Context, dag: DagArg = None, request: RequestArg = None, name: str | None = None
    ) -> dict[str, Any]:
        """A dry run of submit_task: whether it is valid, its problems and warnings, and where each
        node would run now. Creates nothing."""
        async with api(ctx) as client:
            return (await client.validate(dag, request=request, name=name)).model_dump(mode="json")

    @server.tool(annotations=RUNS)
    async def submit_task(
        ctx: Context,
        dag: DagArg = None,
        request: RequestArg = None,
        name: str | None = None,
        idempotency_key: Annotated[
            str | None, Field(description="the same key and body return the task made before, never a second")
        ] = None,
    ) -> dict[str, Any]:
        """Submit a task: a DAG, or a plain request the planner turns into one. Its nodes run tool
        calls on real devices. Returns the task (its id, state and nodes)."""
        async with api(ctx) as client:
            task = await client.submit(dag, request=request, name=name, idempotency_key=idempotency_key)
            return _task_view(task)

    @server.tool(annotations=READ)
    async def get_task(
        ctx: Context, task: Annotated[str, Field(description="a task's id, id prefix or name")]
    ) -> dict[str, Any]:
        """A task with its nodes: each node's state, device, output and error."""
        async with api(ctx) as client:
            return _task_view(await client.task(task))

    @server.tool(annotations=READ)
    async def wait_for_task(
        ctx: Context,
        task: Annotated[str, Field(description="a task's id, id prefix or name")],
        timeout_s: Annotated[float, Field(gt=0, le=MAX_WAIT_S, description="how long to wait at most")] = 60.0,
    ) -> dict[str, Any]:
        """Wait until the task ends or `timeout_s` passes, reporting progress (nodes ended of all
        nodes); the task as it then stands (`ended` false if it still runs: wait again)."""
        async with api(ctx) as client:
            current = await client.task(task)
            with anyio.move_on_after(timeout_s):
                while True:
                    nodes = current.nodes or []
                    ended = len([node for node in nodes if node.ended])
                    await ctx.report_progress(ended, len(nodes), f"{ended} of {len(nodes)} nodes ended")
                    if current.ended:
                        break
                    await anyio.sleep(WAIT_STEP_S)
                    current = await client.task(current.id)
            return _task_view(current)

    @server.tool(annotations=CHANGES)
    async def cancel_task(
        ctx: Context, task: Annotated[str, Field(description="a task's id, id prefix or name")]
    ) -> dict[str, Any]:
        """Cancel a task: its queued and pending nodes are cancelled, running batches told to stop."""
        async with api(ctx) as client:
            return (await client.cancel(task)).model_dump(mode="json")

    @server.tool(annotations=RUNS)
    async def rerun_task(
        ctx: Context,
        task: Annotated[str, Field(description="an ended task's id, id prefix or name")],
        from_node: Annotated[str | None, Field(description="run again from this node and what follows it")] = None,
    ) -> dict[str, Any]:
        """Run an ended task again as a new task: all of it, or from one node on."""
        async with api(ctx) as client:
            return _task_view(await client.rerun(task, from_node))

    @server.tool(annotations=READ)
    async def list_approvals(
        ctx: Context,
        state: Annotated[
            Literal["pending", "approved", "denied", "expired", "cancelled"] | None,
            Field(description="only approvals in this state (all of them when null)"),
        ] = "pending",
    ) -> list[dict[str, Any]]:
        """Approvals, oldest first: the command each would run, its device and its task."""
        async with api(ctx) as client:
            return [a.model_dump(mode="json") async for a in client.approvals(state)]

    @server.tool(annotations=READ, structured_output=False)  # content blocks: the JSON, then an image
    async def get_approval(ctx: Context, approval: Annotated[str, Field(description="an approval's id")]) -> list[Any]:
        """One approval: the command and why it waits; for a GUI action, the screenshot it was
        planned on, as an image."""
        async with api(ctx) as client:
            found = await client.approval(approval)
            shown: list[Any] = [found.model_dump(mode="json")]
            if found.screenshot_url:
                shown.append(Image(data=await client.approval_screenshot(found.id), format="png"))
            return shown

    @server.tool(annotations=CHANGES)
    async def decide_approval(
        ctx: Context,
        approval: Annotated[str, Field(description="a pending approval's id")],
        decision: Literal["approve", "deny"],
        reason: str = "",
    ) -> dict[str, Any]:
        """Approve or deny a pending approval (an operator's key); the approval as it now stands."""
        async with api(ctx) as client:
            return (await client.decide(approval, decision, reason)).model_dump(mode="json")

    @server.tool(annotations=READ)
    async def list_artifacts(
        ctx: Context, task: Annotated[str, Field(description="a task's id")]
    ) -> list[dict[str, Any]]:
        """A task's artifacts (files its nodes kept), newest version of each name."""
        async with api(ctx) as client:
            return [a.model_dump(mode="json") async for a in client.artifacts(task)]

    @server.tool(annotations=READ)
    async def get_artifact(
        ctx: Context,
        task: Annotated[str, Field(description="a task's id")],
        name: str,
        version: int | None = None,
    ) -> dict[str, Any]:
        """One artifact: its description and, when it is text of up to 256 KiB, its content."""
        async with api(ctx) as client:
            found = await client.artifact(task, name, version)
            shown = found.model_dump(mode="json")
            size = int(shown.get("size") or 0)
            if size <= TEXT_LIMIT:
                data = await client.artifact_content(task, name, found.version)
                try:
                    shown["content"] = data.decode()
                except UnicodeDecodeError:
                    shown["content_base64"] = base64.b64encode(data).decode()
            return shown

    @server.resource("orrery://devices/{device}", mime_type="application/json")
    async def device_resource(device: str, ctx: Context) -> dict[str, Any]:
        """One device with its tools."""
        async with _client(client_for, ctx, ResourceError) as client:
            return (await client.device(device)).model_dump(mode="json")

    @server.resource("orrery://tasks/{task}", mime_type="application/json")
    async def task_resource(task: str, ctx: Context) -> dict[str, Any]:
        """One task with its nodes."""
        async with _client(client_for, ctx, ResourceError) as client:
            return _task_view(await client.task(task))

    return server


@asynccontextmanager
async def _client(client_for: ClientFor, ctx: Context, error: type[Exception]) -> AsyncIterator[AsyncClient]:
    """The SDK client for one call; its refusal raised as `error` (a tool's or a resource's,
    whose `not_found` is the MCP `resource not found`), saying the API's code first."""
    try:
        async with client_for(ctx) as client:
            yield client
    except NotFound as exc:
        raise (ResourceNotFoundError if error is ResourceError else error)(_said(exc)) from None
    except OrreryError as exc:
        raise error(_said(exc)) from None


def _said(exc: OrreryError) -> str:
    lines = [f"{exc.code}: {exc.detail}"]
    for problem in exc.problems:
        where = f" ({problem['path']})" if isinstance(problem, dict) and problem.get("path") else ""
        text = problem.get("message") if isinstance(problem, dict) else problem
        code = problem.get("code") if isinstance(problem, dict) else None
        lines.append(f"- {code}: {text}{where}" if code else f"- {text}{where}")
    return "\n".join(lines)


def _device_summary(device: Device) -> dict[str, Any]:
    shown = device.model_dump(mode="json")
    shown["tools"] = [tool.name for tool in device.tools]
    return shown


def _task_view(task: Task) -> dict[str, Any]:
    shown = task.model_dump(mode="json")
    shown["ended"] = task.ended
    return shown


def run_stdio(server: str | None = None, api_key: str | None = None, version: str = "") -> None:
    """`orrery mcp`: the MCP server on standard input and output, for a host that starts it. Every
    tool call is a request to `server` (default as the CLI finds it) with `api_key`."""

    @asynccontextmanager
    async def client_for(ctx: Context) -> AsyncIterator[AsyncClient]:
        async with AsyncClient(server, api_key) as client:
            yield client

    build_server(client_for, version=version).run("stdio")  # stderr: warnings and up (Python's default)
