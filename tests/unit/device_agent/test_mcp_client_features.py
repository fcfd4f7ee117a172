"""The MCP client capabilities the agent declares to third-party servers, against a server on the
current protocol (2026-07-28, where a tool asks for roots, input or a model through resolvers)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from mcp import types
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve, Sample
from pydantic import BaseModel

from device_agent.mcp_client import ClientFeatures
from device_agent.toolset_host import ToolsetHost


class Confirm(BaseModel):
    sure: bool


def roots() -> ListRoots:
    return ListRoots()


def confirm() -> Elicit[Confirm]:
    return Elicit("Delete everything?", Confirm)


def sample() -> Sample:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))
    return Sample([message], max_tokens=5)


def asking_server() -> MCPServer:
    server = MCPServer("asker")

    @server.tool()
    def where(listing: Annotated[types.ListRootsResult, Resolve(roots)]) -> list[str]:
        """The client's roots."""
        return [str(r.uri) for r in listing.roots]

    @server.tool()
    def delete(answer: Annotated[Confirm | None, Resolve(confirm)]) -> str:
        """Deletes only when a person confirms."""
        return "deleted" if answer is not None and answer.sure else "kept"

    @server.tool()
    def think(reply: Annotated[types.CreateMessageResult, Resolve(sample)]) -> str:
        """Needs the client's model."""
        return str(reply.content)

    return server


async def test_roots_are_the_workspace_input_is_declined_and_sampling_is_refused_at_once(tmp_path: Path) -> None:
    workspace = (tmp_path / "ws").resolve()
    host = ToolsetHost("asker", asking_server(), features=ClientFeatures(roots=(workspace,)))
    await host.start()
    try:
        where = await host.call("where", {}, 10)
        assert not where.is_error and where.structured_content == {"result": [workspace.as_uri()]}
        delete = await host.call("delete", {}, 10)  # the server's tool fails on a declined answer
        assert delete.is_error and "decline" in str(delete.content), delete
        think = await host.call("think", {}, 10)  # refused within the limit, not a hang
        assert think.is_error and think.structured_content is not None, think
        assert "did not declare the sampling capability" in think.structured_content["message"]
        assert (await host.call("where", {}, 10)).structured_content == where.structured_content
        assert host.restarts == 0  # a refused call is not a broken server
    finally:
        await host.stop()


async def test_no_roots_configured_declares_no_roots_capability(tmp_path: Path) -> None:
    host = ToolsetHost("asker", asking_server(), features=ClientFeatures(roots=()))
    await host.start()
    try:
        where = await host.call("where", {}, 10)
        assert where.is_error and where.structured_content is not None, where
        assert "did not declare the roots capability" in where.structured_content["message"]
        assert host.restarts == 0
    finally:
        await host.stop()
