"""Orrery's MCP server, driven by the official `mcp` SDK's client as an AI assistant's host would:
over Streamable HTTP at `/mcp` on a real orchestrator with a real agent, and over stdio through
`orrery mcp`. Devices listed, a task validated and submitted, its approval decided, its end
waited for with progress, its result read; the caller's key and role decide what it may do;
Host and Origin checked (DNS rebinding); refusals come back as tool errors with the API's code."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from tests.support import Fleet

APPROVE_WRITES = {"ORRERY_AGENT_APPROVAL_REQUIRED": '["files.write"]'}
READ_ONLY = {
    "list_devices",
    "describe_device",
    "validate_task",
    "get_task",
    "wait_for_task",
    "list_approvals",
    "get_approval",
    "list_artifacts",
    "get_artifact",
}
CHANGING = {"submit_task", "cancel_task", "rerun_task", "decide_approval"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("mcp")) as f:
        f.agent("desk", **APPROVE_WRITES)  # waits until it is idle
        yield f


def a_dag(path: str) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "id": "note",
                "placement": {"device": "desk"},
                "commands": [{"tool": "files.write", "arguments": {"path": path, "content": "hello\n"}}],
            },
            {
                "id": "read",
                "placement": {"device": "desk"},
                "commands": [{"tool": "files.read", "arguments": {"path": path}}],
            },
        ],
        "edges": [{"from": "note", "to": "read"}],
    }


@asynccontextmanager
async def assistant(url: str, key: str | None) -> AsyncIterator[Client]:
    """An MCP host's session with the server at `url`/mcp, sending `key` as its bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as mcp,
    ):
        yield mcp


def data(result: CallToolResult) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        content = result.structured_content
        return content.get("result", content) if set(content) == {"result"} else content
    first = result.content[0]
    assert isinstance(first, TextContent)
    return json.loads(first.text)


def refusal(result: CallToolResult) -> list[str]:
    """A tool error's lines, after the MCP SDK's `Error executing tool <name>: ` prefix: the
    API's `<code>: <detail>`, then one `- <code>: <message>` per problem."""
    assert result.is_error
    first = result.content[0]
    assert isinstance(first, TextContent)
    prefix, _, said = first.text.partition(": ")
    assert prefix.startswith("Error executing tool "), first.text
    return said.splitlines()


def run(coro: Any) -> Any:
    return anyio.run(coro)


def test_an_assistant_lists_devices_submits_a_task_decides_its_approval_and_reads_the_result(fleet: Fleet) -> None:
    path = "assistant/note.txt"  # in the agent's workspace
    progress: list[tuple[float, float | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total))

    async def scenario() -> dict[str, Any]:
        async with assistant(fleet.server.url, fleet.server.api_key) as mcp:
            tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
            assert set(tools) == READ_ONLY | CHANGING
            assert all(tools[name].annotations and tools[name].annotations.read_only_hint for name in READ_ONLY)
            assert all(tools[name].annotations and not tools[name].annotations.read_only_hint for name in CHANGING)
            assert "dag" in tools["submit_task"].input_schema["properties"]

            devices = data(await mcp.call_tool("list_devices", {}))
            desk = next(d for d in devices if d["name"] == "desk")
            assert "files.write" in desk["tools"]
            described = data(await mcp.call_tool("describe_device", {"device": "desk"}))
            assert any(t["name"] == "files.read" and t.get("input_schema") for t in described["tools"])

            checked = data(await mcp.call_tool("validate_task", {"dag": a_dag(path)}))
            assert checked["valid"] is True
            task = data(await mcp.call_tool("submit_task", {"dag": a_dag(path), "name": "from an assistant"}))

            async def pending() -> list[dict[str, Any]]:
                return data(await mcp.call_tool("list_approvals", {}))

            with anyio.fail_after(30):
                while not (waiting := [a for a in await pending() if a["task_id"] == task["id"]]):
                    await anyio.sleep(0.1)
            shown = (await mcp.call_tool("get_approval", {"approval": waiting[0]["id"]})).content
            assert len(shown) == 1  # no screenshot: not a GUI action
            waited: list[dict[str, Any]] = []

            async def wait() -> None:
                arguments = {"task": task["id"], "timeout_s": 60}
                waited.append(data(await mcp.call_tool("wait_for_task", arguments, progress_callback=on_progress)))

            async with anyio.create_task_group() as group:
                group.start_soon(wait)
                with anyio.fail_after(30):
                    while not progress:  # the wait has begun, the task held by its approval
                        await anyio.sleep(0.05)
                decision = {"approval": waiting[0]["id"], "decision": "approve"}
                decided = data(await mcp.call_tool("decide_approval", decision))
                assert decided["id"] == waiting[0]["id"]
            ended = waited[0]
            again = data(await mcp.call_tool("get_task", {"task": task["id"]}))
            assert again["state"] == ended["state"]
            return ended

    ended = run(scenario)
    assert ended["ended"] is True and ended["state"] == "succeeded", [(n["id"], n.get("error")) for n in ended["nodes"]]
    read = next(n for n in ended["nodes"] if n["id"] == "read")
    assert "hello" in json.dumps(read["output"])
    assert progress[0] == (0, 2) and progress[-1] == (2, 2)  # before the approval, and at the end


def test_a_viewers_key_may_read_but_not_submit_and_the_refusal_carries_the_code(fleet: Fleet) -> None:
    with fleet.server.client() as c:
        viewer = c.post("/v1/api-keys", json={"role": "viewer", "name": "assistant"}).json()["key"]

    async def scenario() -> tuple[Any, CallToolResult]:
        async with assistant(fleet.server.url, viewer) as mcp:
            devices = data(await mcp.call_tool("list_devices", {}))
            refused = await mcp.call_tool("submit_task", {"dag": a_dag("viewer.txt")})
            return devices, refused

    devices, refused = run(scenario)
    assert any(d["name"] == "desk" for d in devices)
    assert refusal(refused)[0].startswith("forbidden: ")


def test_an_invalid_dag_and_an_unknown_task_are_tool_errors_a_model_can_act_on(fleet: Fleet) -> None:
    bad = {
        "nodes": [{"id": "a", "commands": [{"tool": "files.read", "arguments": {}}]}],
        "edges": [{"from": "a", "to": "b"}],
    }

    async def scenario() -> tuple[CallToolResult, CallToolResult]:
        async with assistant(fleet.server.url, fleet.server.api_key) as mcp:
            return await mcp.call_tool("submit_task", {"dag": bad}), await mcp.call_tool("get_task", {"task": "t_nope"})

    invalid, unknown = run(scenario)
    lines = refusal(invalid)
    assert lines[0].startswith("unknown_node: "), lines
    assert "- invalid_arguments: node 'a' command 0 (files.read): argument 'path' is required but missing" in lines
    assert refusal(unknown)[0].startswith("not_found: ")


def test_without_a_valid_key_the_endpoint_answers_the_apis_401_problem(fleet: Fleet) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    for key in (None, "orr_not_a_real_key"):
        sent = dict(headers, **({"Authorization": f"Bearer {key}"} if key else {}))
        resp = httpx2.post(f"{fleet.server.url}/mcp", json=body, headers=sent, timeout=10)
        assert resp.status_code == 401
        assert resp.json()["code"] == "unauthorized"


def test_a_foreign_host_or_origin_is_refused_dns_rebinding(fleet: Fleet) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    base = {
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {fleet.server.api_key}",
    }
    foreign_host = httpx2.post(
        f"{fleet.server.url}/mcp", json=body, headers=dict(base, Host="evil.example"), timeout=10
    )
    assert foreign_host.status_code == 421
    foreign_origin = httpx2.post(
        f"{fleet.server.url}/mcp", json=body, headers=dict(base, Origin="http://evil.example"), timeout=10
    )
    assert foreign_origin.status_code == 403
    loopback_origin = httpx2.post(
        f"{fleet.server.url}/mcp", json=body, headers=dict(base, Origin="http://localhost:1234"), timeout=10
    )
    assert loopback_origin.status_code == 200


def test_orrery_mcp_serves_the_same_tools_on_stdio(fleet: Fleet) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORRERY_")}
    env.update(ORRERY_URL=fleet.server.url, ORRERY_API_KEY=fleet.server.api_key)
    params = StdioServerParameters(command=sys.executable, args=["-m", "orchestrator.cli", "mcp"], env=env)

    async def scenario() -> tuple[set[str], Any]:
        async with Client(params) as mcp:
            names = {tool.name for tool in (await mcp.list_tools()).tools}
            return names, data(await mcp.call_tool("list_devices", {}))

    names, devices = run(scenario)
    assert names == READ_ONLY | CHANGING
    assert any(d["name"] == "desk" for d in devices)


def test_resources_read_a_device_and_a_missing_task_is_not_found(fleet: Fleet) -> None:
    async def scenario() -> tuple[Any, str]:
        async with assistant(fleet.server.url, fleet.server.api_key) as mcp:
            device = await mcp.read_resource("orrery://devices/desk")
            try:
                await mcp.read_resource("orrery://tasks/t_nope")
            except Exception as exc:  # the SDK raises the MCP error it was answered
                return device, str(exc)
            return device, ""

    device, missing = run(scenario)
    first = device.contents[0]
    assert json.loads(first.text)["name"] == "desk"
    assert "not_found" in missing
