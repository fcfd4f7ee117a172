"""The catalogue a built-in toolset reports says that undeclared arguments are refused, so the
server can refuse them at submission (issue 13, item 5) instead of the device at run time."""

from __future__ import annotations

from pathlib import Path

from mcp import Client

from device_agent.runner import BUILTIN
from device_agent.toolset_host import tool_spec
from tests.unit.device_agent.toolkit import make_ctx


async def test_strict_toolsets_report_additional_properties_false_and_others_keep_their_schema(
    tmp_path: Path,
) -> None:
    for toolset in ("shell", "files", "system"):
        async with Client(BUILTIN[toolset](make_ctx(tmp_path))) as client:
            tools = (await client.list_tools()).tools
        for t in tools:
            assert tool_spec(toolset, t, strict=True).input_schema["additionalProperties"] is False
            assert "additionalProperties" not in tool_spec(toolset, t).input_schema
            assert "additionalProperties" not in t.input_schema  # the MCP tool itself is unchanged
