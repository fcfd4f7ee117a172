"""Issue 14 item 1, at the router: one check refuses a NUL byte anywhere in a built-in tool's
arguments (values and keys, nested), before the tool is called; the catalogue says so for the server.

Real MCP servers behind a real `Router`: a strict (built-in style) probe with an `env` mapping, the
same probe as a third-party server (its arguments are its own business), and the real toolsets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.server.mcpserver import MCPServer

from device_agent.audit import AuditLog
from device_agent.policy import Policy
from device_agent.router import CallLimit, Router
from device_agent.runner import BUILTIN
from device_agent.toolset_host import ToolsetHost, tool_spec
from device_agent.toolsets.base import NO_NUL_PATTERN, nul_field
from orchestrator.domain.checks import schema_errors
from protocol.messages import Command
from tests.unit.device_agent.toolkit import make_ctx


def probe(calls: list[dict[str, Any]]) -> MCPServer:
    server = MCPServer("probe")

    @server.tool(structured_output=True)
    async def spawn(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        """Record the call (stands for a tool that starts a program)."""
        calls.append({"argv": argv, "env": env})
        return {"ran": True}

    return server


@asynccontextmanager
async def router(tmp_path: Path, calls: list[dict[str, Any]]) -> AsyncIterator[Router]:
    r = Router(Policy(), AuditLog(tmp_path / "audit.jsonl"), [], 256 * 1024)
    r.add(ToolsetHost("strict", probe(calls), strict_arguments=True))
    r.add(ToolsetHost("thirdparty", probe(calls)))
    await r.start()
    try:
        yield r
    finally:
        await r.stop()


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"argv": ["rm\x00x", "f"]}, "argv[0]"),
        ({"argv": ["echo", "keep\x00DROPPED"]}, "argv[1]"),
        ({"argv": ["env"], "env": {"PATH": "/bin\x00:/tmp"}}, "env.PATH"),
        ({"argv": ["env"], "env": {"LD_PRELOAD\x00": "x"}}, "env.LD_PRELOAD\\0 (its name)"),
    ],
)
async def test_a_nul_in_a_built_in_tools_arguments_is_refused_before_the_tool_runs(
    tmp_path: Path, arguments: dict[str, Any], field: str
) -> None:
    calls: list[dict[str, Any]] = []
    async with router(tmp_path, calls) as r:
        result = await r.call(Command(call_id="c1", tool="strict.spawn", arguments=arguments), "b1", CallLimit(10))
    assert result.status == "failure" and result.error is not None
    assert result.error.code == "invalid_arguments"
    assert result.error.message.startswith(f"argument {field} contains a NUL byte (U+0000)")
    assert result.result == {"field": field}
    assert calls == []  # the tool was never called
    assert '"decision":"denied"' in (tmp_path / "audit.jsonl").read_text()


async def test_a_third_party_server_gets_its_arguments_as_sent(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    async with router(tmp_path, calls) as r:
        result = await r.call(
            Command(call_id="c1", tool="thirdparty.spawn", arguments={"argv": ["a\x00b"]}), "b1", CallLimit(10)
        )
    assert result.status == "success", result.error
    assert calls == [{"argv": ["a\x00b"], "env": None}]


def test_nul_field_names_the_first_offender_and_lets_data_arguments_be() -> None:
    assert nul_field("shell.run", {"argv": ["ls"], "cwd": "."}) is None
    assert nul_field("shell.run", {"argv": ["cat"], "stdin": "a\x00b"}) is None  # stdin is a pipe's bytes
    assert nul_field("files.write", {"path": "f", "content": "a\x00b"}) is None  # content is the file's bytes
    assert nul_field("files.write", {"path": "f\x00", "content": "x"}) == "path"
    assert nul_field("files.read", {"content": "a\x00b"}) == "content"  # data only where the tool says so
    assert nul_field("x.y", {"a": [{"b": ["ok", "n\x00"]}]}) == "a[0].b[1]"
    assert nul_field("x.y", {"a\x00": 1}) == "a\\0 (its name)"


async def test_the_catalogue_schemas_refuse_a_nul_wherever_the_router_does(tmp_path: Path) -> None:
    schemas = {}
    for toolset in ("shell", "files", "system"):
        async with Client(BUILTIN[toolset](make_ctx(tmp_path))) as client:
            for t in (await client.list_tools()).tools:
                spec = tool_spec(toolset, t, strict=True)
                schemas[spec.name] = spec.input_schema
                loose = tool_spec(toolset, t).input_schema  # third-party style: the schema as the tool gave it
                assert loose == dict(t.input_schema) and NO_NUL_PATTERN not in str(loose)
    run = Draft202012Validator(schemas["shell.run"])
    assert run.is_valid({"argv": ["ls", "-l"], "cwd": "sub", "stdin": "a\x00b"})
    assert not run.is_valid({"argv": ["rm\x00x"]})
    assert not run.is_valid({"argv": ["ls"], "cwd": "a\x00"})
    write = Draft202012Validator(schemas["files.write"])
    assert write.is_valid({"path": "f", "content": "a\x00b"})
    assert not write.is_valid({"path": "f\x00", "content": "x"})
    assert schemas["files.read"]["properties"]["path"]["pattern"] == NO_NUL_PATTERN
    assert Draft202012Validator(schemas["system.echo"]).is_valid({"text": "a\x00b"})
    assert not Draft202012Validator(schemas["system.disk"]).is_valid({"path": ".\x00"})


async def test_submission_names_a_nul_in_a_value_or_a_key_of_a_nested_mapping() -> None:
    async with Client(probe([])) as client:
        (spawn,) = (await client.list_tools()).tools
    schema = tool_spec("strict", spawn, strict=True).input_schema
    assert schema_errors("strict.spawn", {"argv": ["x"], "env": {"A": "b"}}, schema) == []
    assert schema_errors("strict.spawn", {"argv": ["x"], "env": {"A": "b\x00"}}, schema) == [
        ("env.A", "argument 'env.A' contains a NUL byte (U+0000), which strict.spawn refuses; remove it")
    ]
    ((where, message),) = schema_errors("strict.spawn", {"argv": ["x"], "env": {"A\x00": "b"}}, schema)
    assert where == "env" and message.startswith("a key of argument 'env' contains a NUL byte")
