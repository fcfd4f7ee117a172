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
scenarios' `test-tool`). For the `auth/*` scenarios the server entry has an `oauth` section, written
from what the suite hands a client in `MCP_CONFORMANCE_CONTEXT` as a device owner would write it
(`oauth_config`): the device's client credentials (a secret, or a private key, kept in a 0600
file as an owner would) for the client-credentials scenarios, a pre-registered client where the
context names one, else the authorization code flow with the suite's client ID metadata document
URL. The exit status is 0 when the connection and every call succeeded, 1
with the reason on stderr otherwise. tests/conformance runs every client scenario through it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from device_agent.config import McpOAuthConfig, McpServerConfig
from device_agent.datadir import PRIVATE_FILE
from device_agent.policy import Policy
from device_agent.runner import mcp_host
from device_agent.toolset_host import ToolsetUnavailable
from device_agent.toolsets.base import ToolsetContext

log = logging.getLogger("orrery.agent.conformance")

# Arguments for the suite's tools that take some; any other tool is called with none.
ARGUMENTS: dict[str, dict[str, Any]] = {"add_numbers": {"a": 5, "b": 3}}
CONNECT_TIMEOUT_S = 20.0  # the suite gives a client 30 s in all
CALL_TIMEOUT_S = 10.0
# The client ID metadata document URL the suite's authorization servers expect (auth/basic-cimd);
# a device owner would give the https URL where they publish the agent's document.
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"


def oauth_config(scenario: str, context: dict[str, Any], scratch: Path) -> McpOAuthConfig | None:
    """The `oauth` section an owner would write for the server of `scenario`, from the suite's context."""
    if not scenario.startswith("auth/"):
        return None
    client_id = context.get("client_id")
    if "client-credentials" in scenario and client_id:
        if "private_key_pem" in context:
            key = scratch / "client-key.pem"
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
            with os.fdopen(fd, "w") as out:
                out.write(context["private_key_pem"])
            algorithm = context.get("signing_algorithm", "RS256")
            return McpOAuthConfig.model_validate(
                {"client_id": client_id, "private_key_file": key, "signing_algorithm": algorithm}
            )
        return McpOAuthConfig.model_validate({"client_id": client_id, "client_secret": context.get("client_secret")})
    if client_id:
        return McpOAuthConfig.model_validate(
            {"grant": "authorization_code", "client_id": client_id, "client_secret": context.get("client_secret")}
        )
    return McpOAuthConfig(grant="authorization_code", client_metadata_url=CLIENT_METADATA_URL)


async def run(url: str) -> list[str]:
    """Connect to `url` as the agent connects to an HTTP MCP server, call each of its tools once;
    the problems met (empty when all went well)."""
    with tempfile.TemporaryDirectory(prefix="orrery-conformance-") as scratch:
        workspace = Path(scratch) / "workspace"
        workspace.mkdir()
        ctx = ToolsetContext(workspace=workspace, policy=Policy(), data_dir=Path(scratch) / "data")
        scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
        context: dict[str, Any] = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
        oauth = oauth_config(scenario, context, Path(scratch))
        host = mcp_host(McpServerConfig(namespace="conformance", url=url, oauth=oauth), ctx)
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
