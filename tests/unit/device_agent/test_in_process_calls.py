"""Built-in toolsets called in process give the same results as through the MCP client.

The real toolsets (system, shell, files, gui), each behind a real `Router` twice: once with
`in_process=True` (the agent's path: `InProcessServer`) and once with `in_process=False` (every
call through the SDK's `Client` and its in-memory transport, the path every call took before).
The same calls go to both, in the same workspace reset between them: valid ones, invalid and
unknown arguments, tool errors, timeouts (the tool's own and the router's) and a shell cancel.
Each pair of `Result`s must be equal but for `duration_ms`; a few fields that change from one
call to the next whatever the path (uptimes, process lists, elapsed times) are compared by
their keys only. The audit lines must match too.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Annotated, Any, cast

import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from typing_extensions import TypedDict

from device_agent.policy import Policy
from device_agent.router import CallLimit, Router
from device_agent.runner import BUILTIN
from device_agent.toolset_host import InProcessServer, ToolsetHost
from device_agent.toolsets.base import READ_ONLY, Toolkit, ToolsetContext, in_process_tools, tool
from protocol.messages import Command, Result
from tests.unit.device_agent.toolkit import routing

Call = tuple[str, dict[str, Any]]

UNKNOWN = {"zzz_not_an_argument": 1}

CALLS: dict[str, list[Call]] = {
    "system": [
        ("system.info", {}),
        ("system.info", UNKNOWN),
        ("system.echo", {"text": "hello"}),
        ("system.echo", {}),
        ("system.echo", {"text": 5}),
        ("system.echo", {"text": "x", **UNKNOWN}),
        ("system.echo", {"text": "nul\x00is data here"}),
        ("system.processes", {"limit": 2}),
        ("system.processes", {"limit": "many"}),
        ("system.processes", {"limit": -1}),
        ("system.disk", {"path": "."}),
        ("system.disk", {"path": "no/such/dir"}),
        ("system.disk", {"path": "../../../.."}),
        ("system.disk", {"path": "a\x00b"}),
        ("system.nope", {}),
    ],
    "shell": [
        ("shell.run", {"argv": ["echo", "hi"]}),
        ("shell.run", {"argv": ["sh", "-c", "echo out; echo err >&2; exit 3"]}),
        ("shell.run", {"argv": ["cat"], "stdin": "fed"}),
        ("shell.run", {"argv": []}),
        ("shell.run", {}),
        ("shell.run", {"argv": "echo hi"}),
        ("shell.run", {"argv": ["echo"], **UNKNOWN}),
        ("shell.run", {"argv": ["no-such-program-anywhere"]}),
        ("shell.run", {"argv": ["echo"], "cwd": "missing"}),
        ("shell.run", {"argv": ["echo"], "cwd": "../.."}),
        ("shell.run", {"argv": ["echo"], "timeout_s": 0}),
        ("shell.run", {"argv": ["echo"], "timeout_s": 99999}),
        ("shell.run", {"argv": ["sleep", "5"], "timeout_s": 0.3}),
        ("shell.run", {"argv": ["rm\x00x"]}),
    ],
    "files": [
        ("files.write", {"path": "a.txt", "content": "one\n"}),
        ("files.append", {"path": "a.txt", "content": "two\n"}),
        ("files.read", {"path": "a.txt"}),
        ("files.write", {"path": "b.bin", "content": "AAEC", "encoding": "base64"}),
        ("files.read", {"path": "b.bin"}),
        ("files.write", {"path": "a.txt", "content": "x", "append": True}),
        ("files.write", {"path": "a.txt"}),
        ("files.write", {"path": "a.txt", "content": "x", "encoding": "rot13"}),
        ("files.list", {}),
        ("files.list", {"path": ".", "limit": 1}),
        ("files.list", {"path": "nowhere"}),
        ("files.read", {"path": "nowhere.txt"}),
        ("files.read", {"path": "../../etc/passwd"}),
        ("files.read", {"path": 7}),
        ("files.delete", {"path": "b.bin"}),
        ("files.delete", {"path": "b.bin"}),
        ("files.delete", {"path": ".", "recursive": "yes"}),
        ("files.publish_artifact", {"path": "a.txt"}),  # no batch runs: a tool_error
        ("files.publish_artifact", {"path": "../a.txt", "name": "a"}),
        ("files.fetch_artifact", {"path": "c.txt", "name": "a.txt"}),
        ("files.fetch_artifact", {"path": "c.txt"}),  # neither name nor sha256
        ("files.fetch_artifact", {"path": "c.txt", "sha256": "not-hex"}),
    ],
    "gui": [
        ("gui.observe", {}),
        ("gui.observe", UNKNOWN),
        ("gui.click", {"observation_id": "o1", "action_id": "a1", "x": 1, "y": 2}),
        ("gui.click", {"observation_id": "o1", "action_id": "a1", "x": "left"}),
        ("gui.type", {"observation_id": "o1", "action_id": "a2", "text": "hi", **UNKNOWN}),
        ("gui.key", {"observation_id": "o1", "action_id": "a3", "key": "Return"}),
        ("gui.scroll", {"observation_id": "o1", "action_id": "a4", "x": 1, "y": 1, "direction": "sideways"}),
        ("gui.wait", {"observation_id": "o1", "action_id": "a5", "ms": -5}),
        ("gui.double_click", {"observation_id": "o1", "action_id": "a6", "x": 3, "y": 4}),
        ("gui.drag", {"observation_id": "o1", "action_id": "a7", "x": 0, "y": 0, "to_x": 5}),
        ("gui.set_value", {"observation_id": "o1", "action_id": "a8", "element_id": 3, "name": "N", "value": 5}),
        ("gui.click", {"observation_id": "o1", "action_id": "a9", "element_id": 0}),
        ("gui.windows", {}),
        ("gui.focus_window", {"window_id": 5}),
        ("gui.launch", {"argv": ["true"]}),
        ("gui.stop", {}),
    ],
}

# Fields whose values differ between two runs of the same call on either path.
VOLATILE: dict[str, Callable[[Any], Any]] = {
    "system.info": lambda r: sorted(r) if isinstance(r, dict) else r,
    "system.processes": lambda r: sorted(r) if isinstance(r, dict) else r,
    "system.disk": lambda r: sorted(r) if isinstance(r, dict) else r,
}
ELAPSED = ("duration_ms", "elapsed_ms", "elapsed_s", "duration_s")


def comparable(tool: str, result: Result) -> dict[str, Any]:
    data = result.model_dump(mode="json")
    data.pop("duration_ms")
    if result.status == "success" and tool in VOLATILE:
        data["result"] = VOLATILE[tool](data["result"])
    if isinstance(data["result"], dict):
        data["result"] = {k: v for k, v in data["result"].items() if k not in ELAPSED}
    return data


def audit_lines(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in ("ts", "time", "at", "duration_ms")} for line in lines]


@asynccontextmanager
async def router(workspace: Path, audit_path: Path, namespace: str, in_process: bool) -> AsyncIterator[Router]:
    ctx = ToolsetContext(workspace=workspace, policy=Policy())
    host = ToolsetHost(namespace, BUILTIN[namespace](ctx), strict_arguments=True, in_process=in_process)
    async with routing(ctx.policy, audit_path, host, on_kill=ctx.processes.kill_all) as r:
        yield r


async def run_all(tmp_path: Path, namespace: str, in_process: bool) -> tuple[list[dict[str, Any]], list[Any]]:
    workspace = tmp_path / "workspace"  # the same path both times: messages may name it
    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir()
    audit_path = tmp_path / f"audit-{in_process}.jsonl"
    async with router(workspace, audit_path, namespace, in_process) as r:
        host = r.hosts[namespace]
        assert host.in_process is in_process
        results = []
        for i, (tool, arguments) in enumerate(CALLS[namespace]):
            cmd = Command(call_id=f"c{i}", tool=tool, arguments=arguments)
            results.append(comparable(tool, await r.call(cmd, "b1", CallLimit(20.0))))
    return results, audit_lines(audit_path)


@pytest.mark.parametrize("namespace", sorted(CALLS))
async def test_every_built_in_tool_answers_the_same_in_process_as_through_mcp(tmp_path: Path, namespace: str) -> None:
    ctx = ToolsetContext(workspace=tmp_path, policy=Policy())
    server = BUILTIN[namespace](ctx)
    tools = {t.name for t in await server.list_tools()}
    assert {c[0].split(".", 1)[1] for c in CALLS[namespace]} >= tools  # every tool is called

    through_mcp, mcp_audit = await run_all(tmp_path, namespace, in_process=False)
    direct, direct_audit = await run_all(tmp_path, namespace, in_process=True)
    for (name, arguments), a, b in zip(CALLS[namespace], through_mcp, direct, strict=True):
        assert a == b, f"{name} {arguments!r}:\n  mcp:    {a}\n  direct: {b}"
    assert mcp_audit == direct_audit
    statuses = {r["status"] for r in direct}
    codes = {r["error"]["code"] for r in direct if r["error"]}
    assert "success" in statuses and "invalid_arguments" in codes  # the calls cover both sides


async def test_a_shell_timeout_and_a_cancel_end_the_same_on_both_paths(tmp_path: Path) -> None:
    async def one(in_process: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        workspace = tmp_path / "workspace"
        workspace.mkdir(exist_ok=True)
        async with router(workspace, tmp_path / f"audit-{in_process}.jsonl", "shell", in_process) as r:
            slow = Command(call_id="t", tool="shell.run", arguments={"argv": ["sleep", "5"]})
            timed_out = await r.call(slow, "b1", CallLimit(0.5))
            ctx_processes = r.kill_running
            cancel = Command(call_id="k", tool="shell.run", arguments={"argv": ["sleep", "30"]})
            call = asyncio.create_task(r.call(cancel, "b2", CallLimit(20.0)))
            async with asyncio.timeout(10):
                while ctx_processes() == 0:  # kill_all signals 0 groups until the child exists
                    await asyncio.sleep(0.02)
                cancelled = await call
        return comparable("shell.run", timed_out), comparable("shell.run", cancelled)

    mcp_timeout, mcp_cancel = await one(False)
    direct_timeout, direct_cancel = await one(True)
    assert mcp_timeout["error"]["code"] == "timeout" and mcp_timeout["result"]["limit"] == "command"
    assert mcp_cancel["status"] == "failure" and mcp_cancel["error"]["code"] == "cancelled", mcp_cancel
    assert direct_timeout == mcp_timeout
    assert direct_cancel == mcp_cancel


def hanging() -> MCPServer:
    kit = Toolkit("probe")

    @partial(kit.add, structured_output=True)
    async def hang(text: str = "") -> dict[str, Any]:
        """Never finishes in time; only the router's clock stops it."""
        await asyncio.Event().wait()
        return {"text": text}

    @partial(kit.add, structured_output=True)
    async def boom(text: str = "") -> dict[str, Any]:
        """Raises something no tool should."""
        raise RuntimeError(f"secret detail {text}")

    @kit.add
    async def shaped() -> CallToolResult:
        """Structured content the wire cannot carry as it is: a tuple, a datetime, a set."""
        when = datetime(2026, 12, 2, 15, 40, tzinfo=UTC)
        return CallToolResult(content=[], structured_content={"pair": (1, "a"), "when": when, "tags": {"x"}})

    return kit.server()


async def test_the_routers_own_timeout_a_crashing_tool_and_unshaped_content_end_the_same_on_both_paths(
    tmp_path: Path,
) -> None:
    outcomes = []
    for in_process in (False, True):
        host = ToolsetHost("probe", hanging(), in_process=in_process)
        async with routing(Policy(), tmp_path / f"audit-{in_process}.jsonl", host) as r:
            hung = await r.call(Command(call_id="h", tool="probe.hang"), "b1", CallLimit(0.3))
            crashed = await r.call(Command(call_id="x", tool="probe.boom", arguments={"text": "s"}), "b1", 5.0)
            bad = await r.call(Command(call_id="v", tool="probe.boom", arguments={"text": ["no"]}), "b1", 5.0)
            shaped = await r.call(Command(call_id="s", tool="probe.shaped"), "b1", 5.0)
        # JSON-shaped as the wire carries it, whichever path (compared as Python values: a tuple is no list)
        assert shaped.result == {"pair": [1, "a"], "when": "2026-12-02T15:40:00Z", "tags": ["x"]}
        outcomes.append([comparable("probe", x) for x in (hung, crashed, bad, shaped)])
    through_mcp, direct = outcomes
    assert through_mcp[0]["error"]["code"] == "timeout"
    assert through_mcp[1]["error"]["code"] == "tool_error" and "secret" not in through_mcp[1]["error"]["message"]
    assert through_mcp[2]["error"]["code"] == "invalid_arguments"
    assert direct == through_mcp


class Count(TypedDict):
    n: int


class Loose(TypedDict, total=False):
    n: str


def shapes() -> MCPServer:
    """Tools whose results meet, or miss, the output model they declare."""
    kit = Toolkit("shapes")

    @partial(kit.add, structured_output=True)
    async def count(n: Any = 1) -> Annotated[CallToolResult, Count]:
        """Reports `n` as its count, whatever it is (text misses the output model)."""
        return CallToolResult(content=[TextContent(type="text", text=str(n))], structured_content={"n": n})

    @partial(kit.add, structured_output=True)
    async def failed() -> Annotated[CallToolResult, Count]:
        """An error result, which the output model does not judge."""
        detail = {"code": "tool_error", "message": "it did not work"}
        return CallToolResult(content=[TextContent(type="text", text="no")], structured_content=detail, is_error=True)

    @partial(kit.add, structured_output=True)
    async def plain(n: int = 1) -> Count:
        """A dict, which the SDK converts and checks itself; a negative `n` misses the model."""
        return cast(Count, {"n": n if n >= 0 else "negative"})

    @kit.add
    async def refuses() -> str:
        """Refuses on purpose."""
        raise ToolError("not today")

    return kit.server()


async def test_output_model_checks_and_tool_errors_end_the_same_on_both_paths(tmp_path: Path) -> None:
    calls = [("count", {"n": 2}), ("count", {"n": "two"}), ("failed", {}), ("plain", {"n": 3})]
    calls += [("plain", {"n": -1}), ("refuses", {}), ("count", {"n": 4})]
    outcomes = []
    for in_process in (False, True):
        host = ToolsetHost("shapes", shapes(), in_process=in_process)
        async with routing(Policy(), tmp_path / f"audit-{in_process}.jsonl", host) as r:
            results = []
            for i, (name, arguments) in enumerate(calls):
                cmd = Command(call_id=f"c{i}", tool=f"shapes.{name}", arguments=arguments)
                results.append(comparable("shapes", await r.call(cmd, "b1", 5.0)))
        outcomes.append(results)
    through_mcp, direct = outcomes
    statuses = [r["status"] for r in through_mcp]
    assert statuses == ["success", "failure", "failure", "success", "failure", "failure", "success"]
    assert direct == through_mcp


async def outcome(call: Awaitable[Any]) -> tuple[str, Any]:
    try:
        result = await call
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "returned", result.model_dump()


async def test_a_direct_call_runs_the_tool_object_the_server_serves_and_reads_its_output_model_live() -> None:
    """The Toolkit gives the server the tools it built, and the direct path calls those objects:
    a change to one (here its output model) shows on both paths from the next call on."""
    server = shapes()
    direct = InProcessServer(server)
    assert direct.fast

    async def both(n: Any) -> tuple[str, Any]:
        sdk = await outcome(server.call_tool("count", {"n": n}))
        assert await outcome(direct._call_tool("count", {"n": n})) == sdk
        return sdk

    assert (await both(3))[0] == "returned"
    assert (await both("w"))[0] == "UnexpectedToolError"
    tools = in_process_tools(server)
    assert tools is not None
    tools["count"].fn_metadata.output_model = Loose  # read live by the SDK: text now passes, a number does not
    assert (await both("w"))[0] == "returned"
    assert (await both(3))[0] == "UnexpectedToolError"
    tools["count"].fn_metadata.output_model = Count
    assert (await both(3))[0] == "returned"
    assert (await both("w"))[0] == "UnexpectedToolError"


def test_a_built_in_tool_cannot_take_a_request_context() -> None:
    """Built-in tools run outside any client session, so `tool` refuses one that wants a Context."""
    kit = Toolkit("x")
    with pytest.raises(TypeError, match="request Context"):

        @tool(kit, READ_ONLY)
        async def needs(ctx: Context) -> dict[str, Any]:
            """Needs the client."""
            return {}

    assert kit.tools == []


def test_a_toolkit_refuses_a_name_twice() -> None:
    kit = Toolkit("x")

    @tool(kit, READ_ONLY)
    async def probe() -> dict[str, Any]:
        """One."""
        return {}

    with pytest.raises(ValueError, match="two tools named probe"):
        kit.add(probe, name="probe")


async def test_a_server_no_toolkit_built_takes_the_sdks_own_entry_point() -> None:
    """A plain `MCPServer` (tools registered the SDK's way) is served by `MCPServer.call_tool`,
    with the same outcomes, on the agent's path too."""
    server = MCPServer("plain")

    @server.tool(structured_output=True)
    async def count(n: Any = 1) -> Annotated[CallToolResult, Count]:
        """Reports `n` as its count, whatever it is."""
        return CallToolResult(content=[TextContent(type="text", text=str(n))], structured_content={"n": n})

    public = InProcessServer(server)
    assert not public.fast and in_process_tools(server) is None
    for n in (3, "w"):
        assert await outcome(public._call_tool("count", {"n": n})) == await outcome(server.call_tool("count", {"n": n}))
    assert await outcome(public._call_tool("nope", {})) == await outcome(server.call_tool("nope", {}))
    assert (await public.call("plain", "nope", {}, 5.0)).is_error
