"""The agent's MCP client as the client under test of the official MCP conformance suite.

`python -m device_agent.conformance URL` is the command given to the suite
(`@modelcontextprotocol/conformance`, `conformance client --command ...`). For each client
scenario the suite starts a test server of its own, runs the command with that server's URL
appended as the last argument and the scenario's name in `MCP_CONFORMANCE_SCENARIO`, then judges
the client by what its server saw (and by the command's exit status, in a single-scenario run).

The URL is reached exactly as a configured third-party server is (`[[agent.mcp_servers]]` with a
`url`): `runner.mcp_host` builds the `ToolsetHost`, which connects with the agent's HTTP client
and client features (roots; elicitation declined) and lists the tools. Then every listed tool is
called once through the host, with the arguments the scenarios' tools need (`ARGUMENTS`, else
none): that is what each scenario asks of a client (tools_call's `add_numbers`, the elicitation
scenario's tool that asks for input, sse-retry's tool whose stream the server cuts, the auth
scenarios' `test-tool`). The exit status is 0 when the connection and every call succeeded, 1
with the reason on stderr otherwise. tests/conformance runs every client scenario through it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from device_agent.config import McpServerConfig
from device_agent.policy import Policy
from device_agent.runner import mcp_host
from device_agent.toolset_host import ToolsetUnavailable
from device_agent.toolsets.base import ToolsetContext

log = logging.getLogger("orrery.agent.conformance")

# Arguments for the suite's tools that take some; any other tool is called with none.
ARGUMENTS: dict[str, dict[str, Any]] = {"add_numbers": {"a": 5, "b": 3}}
CONNECT_TIMEOUT_S = 20.0  # the suite gives a client 30 s in all
CALL_TIMEOUT_S = 10.0


async def run(url: str) -> list[str]:
    """Connect to `url` as the agent connects to an HTTP MCP server, call each of its tools once;
    the problems met (empty when all went well)."""
    with tempfile.TemporaryDirectory(prefix="orrery-conformance-") as scratch:
        workspace = Path(scratch) / "workspace"
        workspace.mkdir()
        ctx = ToolsetContext(workspace=workspace, policy=Policy(), data_dir=Path(scratch) / "data")
        host = mcp_host(McpServerConfig(namespace="conformance", url=url), ctx)
        try:
            await host.start(CONNECT_TIMEOUT_S)
        except (ToolsetUnavailable, TimeoutError) as exc:
            await host.stop()
            return [str(exc) or f"no connection within {CONNECT_TIMEOUT_S:g}s"]
        problems: list[str] = []
        try:
            for tool in host.tools:
                try:
                    result = await host.call(tool.name, ARGUMENTS.get(tool.name, {}), CALL_TIMEOUT_S)
                except ToolsetUnavailable as exc:
                    problems.append(str(exc))
                    break
                text = " ".join(getattr(part, "text", "") for part in result.content)
                log.info("%s: %s%s", tool.name, "error: " if result.is_error else "", text[:300])
                if result.is_error:
                    problems.append(f"{tool.name} failed: {text[:300]}")
        finally:
            await host.stop()
        return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m device_agent.conformance URL (the MCP conformance suite appends it)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "(no scenario named)")
    problems = asyncio.run(run(args[-1]))
    for problem in problems:
        print(f"{scenario}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
