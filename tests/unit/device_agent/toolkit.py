"""Calling a toolset through a real MCP client, for the toolset tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult

from device_agent.audit import AuditLog
from device_agent.policy import Policy
from device_agent.router import Router
from device_agent.toolset_host import ToolsetHost
from device_agent.toolsets.base import ToolsetContext

Build = Callable[[ToolsetContext], MCPServer]


def make_ctx(workspace: Path, **policy: Any) -> ToolsetContext:
    return ToolsetContext(workspace=workspace, policy=Policy(**policy))


async def call(build: Build, ctx: ToolsetContext, tool: str, **arguments: Any) -> CallToolResult:
    async with Client(build(ctx)) as client:
        return await client.call_tool(tool, arguments)


async def ok(build: Build, ctx: ToolsetContext, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await call(build, ctx, tool, **arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return dict(result.structured_content)


@asynccontextmanager
async def routing(
    policy: Policy, audit_path: Path, *hosts: ToolsetHost, on_kill: Callable[[], int] = lambda: 0
) -> AsyncIterator[Router]:
    """A started `Router` over `hosts`, with its audit log at `audit_path`; stopped on exit."""
    audit = AuditLog(audit_path)
    r = Router(policy, audit, [], 256 * 1024, on_kill)
    for host in hosts:
        r.add(host)
    await r.start()
    try:
        yield r
    finally:
        await r.stop()
        audit.close()
