"""Retry safety follows the arguments: every built-in tool the engine may retry is safe to retry.

The engine retries an attempt whose outcome is `uncertain` when every tool it called is annotated
`read_only` or `idempotent` (SPEC section 2). MCP hints are per tool, not per call, so a tool is
only allowed those hints if *every* way of calling it is safe to repeat. These tests call each
such tool twice with the same arguments through its real MCP server and check that the
workspace after two calls is the workspace after one. Boolean and enum arguments are tried with
every value, so an option that makes a call unsafe to repeat (`files.write {append: true}`, the
defect these tests were written for) cannot hide behind a safe default.
"""

from __future__ import annotations

import base64
import itertools
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer

from device_agent.audit import AuditLog
from device_agent.policy import Policy
from device_agent.router import Router
from device_agent.runner import BUILTIN
from device_agent.toolset_host import ToolsetHost, tool_spec
from device_agent.toolsets.base import ToolsetContext
from protocol.messages import Command
from tests.unit.device_agent.toolkit import make_ctx

Arguments = dict[str, Any]
Sample = Arguments | Callable[[Client], Awaitable[Arguments]]


async def _fresh_observation(client: Client) -> Arguments:
    observed = await client.call_tool("observe", {})
    assert not observed.is_error and observed.structured_content is not None, observed.content
    return {"observation_id": observed.structured_content["observation_id"], "action_id": "retry-wait-0001", "ms": 200}


# Arguments that make each retry-safe tool do real work in the seeded workspace. Valid base64
# that is also plain text, so both encodings of files.write succeed with the same content.
CONTENT = base64.b64encode(b"hello\n").decode()
SAMPLES: dict[str, list[Sample]] = {
    "system.info": [{}],
    "system.echo": [{"text": "hi"}],
    "system.processes": [{"limit": 5}],
    "system.disk": [{"path": "."}],
    "files.read": [{"path": "notes.txt"}],
    "files.list": [{"path": "dir"}],
    "files.write": [{"path": "notes.txt", "content": CONTENT}, {"path": "dir/new/made.txt", "content": CONTENT}],
    "files.delete": [{"path": "gone.txt"}, {"path": "dir/sub", "recursive": True}],
    "gui.observe": [{}],
    "gui.wait": [_fresh_observation],
    "gui.stop": [{}],
}
# Retry-safe tools that need a running orchestrator and an open batch, so their twice-called
# state is checked end to end with real agents instead (where it is proved).
CHECKED_END_TO_END = {
    "files.publish_artifact": "tests/integration/test_artifacts.py::test_publishing_and_fetching_twice_changes_nothing",
    "files.fetch_artifact": "tests/integration/test_artifacts.py::test_publishing_and_fetching_twice_changes_nothing",
}


def seed(workspace: Path) -> None:
    workspace.mkdir(parents=True)
    (workspace / "notes.txt").write_text("one\n")
    (workspace / "gone.txt").write_text("bye\n")
    (workspace / "dir" / "sub").mkdir(parents=True)
    (workspace / "dir" / "inner.txt").write_text("two\n")
    (workspace / "dir" / "sub" / "deep.txt").write_text("three\n")


def snapshot(workspace: Path) -> dict[str, Any]:
    """What a caller can observe of the workspace: every entry's type, mode and content."""
    state: dict[str, Any] = {}
    for root, dirs, files in os.walk(workspace):
        for name in dirs + files:
            path = Path(root, name)
            mode = path.lstat().st_mode & 0o7777
            rel = path.relative_to(workspace).as_posix()
            if path.is_symlink():
                state[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                state[rel] = ("dir", mode)
            else:
                state[rel] = ("file", mode, path.read_bytes())
    return state


def variants(sample: Arguments, schema: dict[str, Any]) -> list[Arguments]:
    """`sample` with every value of each boolean or enum argument it leaves out."""
    choices: dict[str, list[Any]] = {}
    for name, prop in (schema.get("properties") or {}).items():
        if name in sample:
            continue
        if prop.get("type") == "boolean":
            choices[name] = [False, True]
        elif "enum" in prop:
            choices[name] = list(prop["enum"])
    names = sorted(choices)
    return [
        {**sample, **dict(zip(names, combo, strict=True))} for combo in itertools.product(*(choices[n] for n in names))
    ]


def toolset_params() -> list[Any]:
    gui = pytest.param(
        "gui",
        marks=pytest.mark.skipif(
            not os.environ.get("DISPLAY"),
            reason="the gui toolset needs an X display (its own tests under tests/gui start one)",
        ),
    )
    return [name if name != "gui" else gui for name in sorted(BUILTIN)]


async def _state_after(
    build: Callable[[ToolsetContext], MCPServer], workspace: Path, tool: str, sample: Sample, times: int
) -> tuple[Arguments, dict[str, Any]]:
    """Seed `workspace`, call `tool` `times` times with the same arguments, return them and the state."""
    seed(workspace)
    async with Client(build(make_ctx(workspace))) as client:
        arguments = sample if isinstance(sample, dict) else await sample(client)
        for _ in range(times):
            result = await client.call_tool(tool, arguments)
            assert not result.is_error, f"{tool} {arguments}: {result.content}"
    return arguments, snapshot(workspace)


@pytest.mark.parametrize("toolset", toolset_params())
async def test_every_retry_safe_built_in_tool_leaves_the_same_state_when_called_twice(
    tmp_path: Path, toolset: str
) -> None:
    build = BUILTIN[toolset]
    async with Client(build(make_ctx(tmp_path))) as client:
        tools = (await client.list_tools()).tools
    retry_safe = [t for t in tools if (a := tool_spec(toolset, t).annotations).read_only or a.idempotent]
    runs = 0
    elsewhere = [t for t in retry_safe if f"{toolset}.{t.name}" in CHECKED_END_TO_END]
    retry_safe = [t for t in retry_safe if t not in elsewhere]
    for t in retry_safe:
        name = f"{toolset}.{t.name}"
        assert name in SAMPLES, f"{name} is annotated retry-safe: give it sample arguments here so it is checked"
        for sample in SAMPLES[name]:
            for arguments in variants(sample, t.input_schema) if isinstance(sample, dict) else [sample]:
                runs += 1
                _, once = await _state_after(build, tmp_path / f"run{runs}" / "once", t.name, arguments, 1)
                used, twice = await _state_after(build, tmp_path / f"run{runs}" / "twice", t.name, arguments, 2)
                assert twice == once, f"{name} {used} is annotated retry-safe, but a second call changed the workspace"
                shutil.rmtree(tmp_path / f"run{runs}")
    assert runs >= len(retry_safe)
    for t in elsewhere:
        test_file, _, test_name = CHECKED_END_TO_END[f"{toolset}.{t.name}"].partition("::")
        assert f"def {test_name}(" in (Path(__file__).parents[3] / test_file).read_text()


async def test_files_append_is_the_one_files_tool_that_is_not_retry_safe(tmp_path: Path) -> None:
    async with Client(BUILTIN["files"](make_ctx(tmp_path))) as client:
        tools = (await client.list_tools()).tools
    unsafe = sorted(t.name for t in tools if not tool_spec("files", t).annotations.idempotent)
    assert unsafe == ["append"]


async def test_an_argument_a_built_in_tool_does_not_declare_is_refused_not_ignored(tmp_path: Path) -> None:
    """`files.write {append: true}` from a caller that predates files.append must not replace the file."""
    workspace = tmp_path / "ws"
    seed(workspace)
    audit = AuditLog(tmp_path / "audit.jsonl")
    router = Router(Policy(), audit, [], 256 * 1024)
    router.add(ToolsetHost("files", BUILTIN["files"](make_ctx(workspace)), strict_arguments=True))
    await router.start()
    try:
        arguments = {"path": "notes.txt", "content": "two\n", "append": True}
        result = await router.call(Command(call_id="c1", tool="files.write", arguments=arguments), "b1", 10)
    finally:
        await router.stop()
        audit.close()
    assert result.status == "failure" and result.error is not None
    assert result.error.code == "invalid_arguments"
    assert "'append'" in result.error.message and "files.append" in result.error.message
    assert (workspace / "notes.txt").read_text() == "one\n"
