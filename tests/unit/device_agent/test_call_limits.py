"""The command's `timeout_s` is the limit a tool runs under, and a timeout says which limit it hit.

Real MCP servers behind a real `Router`: a probe toolset that reports the `timeout_s` it was
called with (so a limit above the shell's old 60-s default is checked without waiting a minute),
and the real `shell` toolset killed by each kind of limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer

from device_agent.policy import Policy
from device_agent.router import CallLimit, Router
from device_agent.runner import BUILTIN
from device_agent.toolset_host import ToolsetHost
from protocol.messages import Command, Result
from tests.unit.device_agent.toolkit import make_ctx, routing


def probe() -> MCPServer:
    server = MCPServer("probe")

    @server.tool(structured_output=True)
    async def wait(timeout_s: float | None = None) -> dict[str, Any]:
        """Report the timeout_s this call was given."""
        return {"timeout_s": timeout_s}

    @server.tool(structured_output=True)
    async def wait_whole(timeout_s: int | None = None) -> dict[str, Any]:
        """Report the timeout_s (whole seconds) this call was given."""
        return {"timeout_s": timeout_s}

    @server.tool(structured_output=True)
    async def hang(text: str = "") -> dict[str, Any]:
        """Never finish in time; takes no timeout_s, so only the router's clock stops it."""
        await asyncio.sleep(60)
        return {"text": text}

    return server


@asynccontextmanager
async def router(tmp_path: Path, **policy: Any) -> AsyncIterator[Router]:
    shell = ToolsetHost("shell", BUILTIN["shell"](make_ctx(tmp_path, **policy)), strict_arguments=True)
    async with routing(Policy(**policy), tmp_path / "audit.jsonl", ToolsetHost("probe", probe()), shell) as r:
        yield r


async def received(r: Router, limit: CallLimit | float, tool: str = "probe.wait", **arguments: Any) -> Any:
    result = await r.call(Command(call_id="c1", tool=tool, arguments=arguments), "b1", limit)
    assert result.status == "success", result.error
    return result.result["timeout_s"]


async def test_a_command_limit_above_the_old_60_s_default_reaches_the_tool(tmp_path: Path) -> None:
    async with router(tmp_path) as r:
        assert await received(r, CallLimit(200.0)) == 200.0
        assert await received(r, 200.0) == 200.0  # a bare number is the command's limit


async def test_an_explicit_argument_is_kept_below_the_limit_and_capped_above_it(tmp_path: Path) -> None:
    async with router(tmp_path) as r:
        assert await received(r, CallLimit(200.0), timeout_s=5) == 5
        assert await received(r, CallLimit(200.0), timeout_s=500) == 200.0
        assert await received(r, CallLimit(7.0, "deadline"), timeout_s=500) == 7.0


async def test_the_device_maximum_caps_the_command_limit(tmp_path: Path) -> None:
    async with router(tmp_path, max_timeout_s=3600) as r:
        assert await received(r, CallLimit(7200.0)) == 3600


async def test_a_whole_seconds_schema_gets_whole_seconds_below_the_limit(tmp_path: Path) -> None:
    async with router(tmp_path) as r:
        assert await received(r, CallLimit(2.5), tool="probe.wait_whole") == 2


def timed_out(result: Result) -> str:
    assert result.status == "failure" and result.error is not None, result
    assert result.error.code == "timeout", result.error
    return result.error.message


SLEEP = {"argv": ["sleep", "5"]}


@pytest.mark.parametrize(
    ("policy", "limit", "arguments", "names", "source"),
    [
        ({}, CallLimit(1.5), {}, "the command's timeout_s (1.5 s)", "command"),
        ({}, CallLimit(30.0), {"timeout_s": 1}, "the tool argument timeout_s (1 s)", "argument"),
        ({}, CallLimit(1.5, "deadline"), {}, "the batch deadline", "deadline"),
        ({"max_timeout_s": 1.5}, CallLimit(30.0), {}, "this device's maximum of 1.5 s", "device"),
    ],
    ids=["command", "argument", "deadline", "device"],
)
async def test_a_shell_timeout_names_the_limit_it_hit(
    tmp_path: Path, policy: dict[str, Any], limit: CallLimit, arguments: dict[str, Any], names: str, source: str
) -> None:
    async with router(tmp_path, **policy) as r:
        started = time.monotonic()
        result = await r.call(Command(call_id="c1", tool="shell.run", arguments={**SLEEP, **arguments}), "b1", limit)
        took = time.monotonic() - started
    message = timed_out(result)
    assert names in message, message
    assert "sleep did not finish within" in message  # the tool's own words stay
    assert took < 4.0, took  # killed at the limit, not at sleep's end
    assert result.result is not None and result.result["limit"] == source  # also machine-readable


async def test_a_tool_without_timeout_s_is_stopped_by_the_router_and_says_which_limit(tmp_path: Path) -> None:
    async with router(tmp_path) as r:
        started = time.monotonic()
        result = await r.call(Command(call_id="c1", tool="probe.hang"), "b1", CallLimit(1.0))
        assert time.monotonic() - started < 3.0
    message = timed_out(result)
    assert "probe.hang did not finish within 1s" in message
    assert "the command's timeout_s (1 s)" in message
