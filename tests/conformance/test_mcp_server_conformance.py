"""The orchestrator's MCP server (`/mcp`) under the official MCP conformance suite's server
scenarios.

Every server scenario of `@modelcontextprotocol/conformance` (its own `list`) runs against a real
orchestrator's `/mcp`: each not in expected_failures.json (its "server" part) must pass, and each in it must
still fail. The suite sends no credentials, and `/mcp` answers nothing without an API key, so it
reaches the server through a loopback proxy that adds the key to each request (and asks for one
request per connection, so every request gets it). Everything else it sends, `Host` and `Origin`
included, goes on unchanged.

Most server scenarios call tools, prompts and resources of the suite's reference server
(`test_simple_text`, `test_prompt_with_image`, ...), which an application server does not have:
they are listed as expected failures, with that reason. Those that apply to any server
(initialize, ping, listing tools, DNS rebinding protection) must pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conformance.suite import (
    EXPECTED_FAILURES,
    Outcome,
    docs_table,
    expected_failures,
    hold_docs_table,
    hold_expected_failures,
    run,
    run_all,
    scenarios,
    suite_installed,
)
from tests.support import ROOT, Fleet, TcpProxy

DOCS = ROOT / "docs" / "how-to" / "mcp-server.md"
TABLE = "## Conformance"
MUST_PASS = {"server-initialize", "ping", "tools-list", "dns-rebinding-protection"}


def with_key(key: str) -> Callable[[bytes], bytes]:
    """A request head with the API key added, and `Connection: close` (one request per
    connection: the proxy rewrites only a connection's first head)."""

    def rewrite(head: bytes) -> bytes:
        lines = [
            line for line in head.split(b"\r\n") if line and not re.match(rb"(?i)(connection|authorization):", line)
        ]
        lines += [b"Authorization: Bearer " + key.encode(), b"Connection: close"]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    return rewrite


@pytest.fixture(scope="module")
def mcp_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with Fleet(tmp_path_factory.mktemp("mcp-conformance")) as fleet:
        proxy = TcpProxy(fleet.server.port, request_head=with_key(fleet.server.api_key))
        try:
            yield f"{proxy.url}/mcp"
        finally:
            proxy.close()


def run_scenario(scenario: str, url: str, results: Path) -> Outcome:
    return run(scenario, results, "server", "--url", url, timeout_s=90)


def test_every_server_scenario_passes_unless_listed_as_an_expected_failure_and_every_listed_one_fails(
    mcp_url: str, tmp_path: Path
) -> None:
    suite_installed()
    expected = expected_failures("server")
    names = scenarios("server")
    assert set(names) >= MUST_PASS and not MUST_PASS & set(expected)
    unknown = sorted(set(expected) - set(names))
    assert not unknown, f"{EXPECTED_FAILURES.name} names server scenarios the suite does not have: {unknown}"
    assert sorted(docs_table(DOCS, TABLE)) == sorted(names), f"{DOCS} must have a row for each of {names}"
    outcomes = run_all(names, lambda s: run_scenario(s, mcp_url, tmp_path))
    hold_expected_failures(outcomes, expected, EXPECTED_FAILURES)


def test_the_docs_table_says_what_expected_failures_json_says_of_the_server() -> None:
    hold_docs_table("server", DOCS, TABLE)
