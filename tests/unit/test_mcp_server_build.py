"""Building Orrery's MCP server leaves the process's logging as it found it: the MCP SDK's server
calls `logging.basicConfig` when made, which in a process that has not set up its logging yet
(`orrery demo`, `orrery mcp`) would put a handler at INFO on the root logger, and every library's
INFO lines would print among the demo's output."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server.mcpserver import Context

from orrery.mcp_server import build_server
from orrery.sdk import AsyncClient


@asynccontextmanager
async def no_client(ctx: Context) -> AsyncIterator[AsyncClient]:
    raise AssertionError("no tool is called here")
    yield  # pragma: no cover


def test_building_the_server_adds_no_handler_and_changes_no_level_of_the_root_logger() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []  # as in a process that has not set up its logging (pytest's own set aside)
    root.setLevel(logging.WARNING)
    try:
        server = build_server(no_client)
        assert root.handlers == [] and root.level == logging.WARNING
    finally:
        root.handlers = handlers
        root.setLevel(level)
    assert server.name == "orrery"
