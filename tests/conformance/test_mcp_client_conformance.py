"""The agent's MCP client under the official MCP conformance suite's client scenarios.

Every client scenario of `@modelcontextprotocol/conformance` (its own `list`) runs through the
suite against `python -m device_agent.conformance` (the agent's own HTTP client path): each not
in expected_failures.json (its "client" part) must pass, and each in it must still fail, so the list cannot go stale.

The suite needs Node 22; `.ci/run` installs both (npm's `node` package and the pinned suite)
under `.ci/mcp-conformance` and names the directory in ORRERY_TEST_MCP_CONFORMANCE_PREFIX.
Elsewhere the test is skipped, with the command that installs them, unless CI is set.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conformance.suite import (
    EXPECTED_FAILURES,
    NODE_MAJOR,
    SUITE_VERSION,
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
from tests.support import ROOT

DOCS = ROOT / "docs" / "how-to" / "third-party-mcp.md"  # its table: scenario, result, reason
TABLE = "## The MCP conformance suite"
CLIENT = f"{sys.executable} -m device_agent.conformance"  # the suite appends the server's URL
# How long the suite waits for the client process to finish a scenario (its default is 30 s). A
# healthy client finishes in about a second, and a failing one exits at once, so a generous bound
# costs nothing; 30 s was once not enough for a Python client to start and connect while the rest
# of the suite loaded both cores ("CLIENT TIMED OUT" after every check of the scenario passed).
SCENARIO_TIMEOUT_MS = 120_000
# sse-retry measures the client's reconnect: due 500 ms after the server cuts the stream, 200 ms
# late at most. On a busy machine (the rest of the suite runs beside this test) a client can be
# that late once; one that ignores `retry` (the SDK's default is 1 s) or sends no Last-Event-ID
# fails every time. So a failed run of it is run once more, alone.
TIMING = frozenset({"sse-retry"})


def run_scenario(scenario: str, results: Path) -> Outcome:
    args = ("client", "--command", CLIENT, "--timeout", str(SCENARIO_TIMEOUT_MS))
    return run(scenario, results, *args, timeout_s=SCENARIO_TIMEOUT_MS / 1000 + 30)


def test_every_client_scenario_passes_unless_listed_as_an_expected_failure_and_every_listed_one_fails(
    tmp_path: Path,
) -> None:
    suite_installed()
    expected = expected_failures("client")
    names = scenarios("client")
    assert "initialize" in names
    unknown = sorted(set(expected) - set(names))
    assert not unknown, f"{EXPECTED_FAILURES.name} names client scenarios the suite does not have: {unknown}"
    assert sorted(docs_table(DOCS, TABLE)) == sorted(names), f"{DOCS} must have a row for each of {names}"
    outcomes = run_all(names, lambda s: run_scenario(s, tmp_path))
    outcomes = [
        run_scenario(o.scenario, tmp_path / "again") if o.scenario in TIMING and not o.passed else o for o in outcomes
    ]
    hold_expected_failures(outcomes, expected, EXPECTED_FAILURES)


def test_the_docs_table_says_what_expected_failures_json_says() -> None:
    hold_docs_table("client", DOCS, TABLE)


def test_ci_installs_the_suite_version_this_test_expects() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"@modelcontextprotocol/conformance@{SUITE_VERSION}" in ci
    assert f'"version": "{SUITE_VERSION}"' in ci
    assert f"node@{NODE_MAJOR}." in ci
    assert "ORRERY_TEST_MCP_CONFORMANCE_PREFIX" in ci
