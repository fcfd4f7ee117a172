"""The agent's MCP client under the official MCP conformance suite's client scenarios.

Every client scenario of `@modelcontextprotocol/conformance` (its own `list`) runs through the
suite against `python -m device_agent.conformance` (the agent's own HTTP client path): each not
in expected_failures.json must pass, and each in it must still fail, so the list cannot go stale.

The suite needs Node 22; `.ci/run` installs both (npm's `node` package and the pinned suite)
under `.ci/mcp-conformance` and names the directory in ORRERY_TEST_MCP_CONFORMANCE_PREFIX.
Elsewhere the test is skipped, with the command that installs them, unless CI is set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, child_env

SUITE_VERSION = "0.1.16"  # .ci/run installs this one
NODE_MAJOR = 22
PREFIX = Path(os.environ.get("ORRERY_TEST_MCP_CONFORMANCE_PREFIX", ROOT / ".ci" / "mcp-conformance"))
NODE = PREFIX / "node_modules" / "node" / "bin" / "node"
SUITE = PREFIX / "node_modules" / "@modelcontextprotocol" / "conformance"
EXPECTED_FAILURES = Path(__file__).with_name("expected_failures.json")
DOCS = ROOT / "docs" / "how-to" / "third-party-mcp.md"  # its table: scenario, result, reason
INSTALL = f"npm install --prefix {PREFIX} node@{NODE_MAJOR} @modelcontextprotocol/conformance@{SUITE_VERSION}"
CLIENT = f"{sys.executable} -m device_agent.conformance"  # the suite appends the server's URL
SCENARIO_TIMEOUT_MS = 30_000
# Scenarios run side by side, a few at a time: each is a node process (the suite and its test
# servers) and one client, about 2.5 s of CPU in all.
PARALLEL = 4
# sse-retry measures the client's reconnect: due 500 ms after the server cuts the stream, 200 ms
# late at most. On a busy machine (the rest of the suite runs beside this test) a client can be
# that late once; one that ignores `retry` (the SDK's default is 1 s) or sends no Last-Event-ID
# fails every time. So a failed run of it is run once more, alone.
TIMING = frozenset({"sse-retry"})


@dataclass(frozen=True)
class Outcome:
    scenario: str
    exit_code: int
    checks: list[dict[str, Any]]
    output: str

    @property
    def passed(self) -> bool:
        """The suite's verdict (exit 0: no failed or warning check, the client exited 0 in time),
        and at least one check passed: a scenario whose server never heard from the client (the
        initialize scenario's) has no checks at all, which the suite would count as a pass."""
        return self.exit_code == 0 and any(c.get("status") == "SUCCESS" for c in self.checks)

    def summary(self) -> str:
        bad = [
            f"{c['id']} {c['status']}: {c.get('errorMessage') or c.get('description')}"
            for c in self.checks
            if c.get("status") in ("FAILURE", "WARNING")
        ]
        return f"{self.scenario} (exit {self.exit_code}): " + ("; ".join(bad) or self.output[-1500:])


def suite_installed() -> None:
    """Skip (fail in CI) unless Node 22 and the pinned suite are installed."""
    problem = None
    if not NODE.exists() or not (SUITE / "package.json").exists():
        problem = f"the MCP conformance suite and Node {NODE_MAJOR} are not installed under {PREFIX}"
    else:
        version = json.loads((SUITE / "package.json").read_text())["version"]
        assert version == SUITE_VERSION, f"{SUITE} is version {version}, not {SUITE_VERSION}: {INSTALL}"
        node = subprocess.run([str(NODE), "--version"], capture_output=True, text=True, timeout=30, check=True)
        assert node.stdout.startswith(f"v{NODE_MAJOR}."), f"{NODE} is {node.stdout.strip()}, not Node {NODE_MAJOR}"
    if problem is not None:
        if os.environ.get("CI"):
            raise AssertionError(f"{problem}; .ci/run installs them")
        pytest.skip(f"{problem} (install them: {INSTALL})")


def conformance(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(NODE), str(SUITE / "dist" / "index.js"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,  # `python -m device_agent.conformance` imports this tree
        env=child_env(),
        timeout=timeout,
        check=False,
    )


def client_scenarios() -> list[str]:
    """The suite's client scenarios, from its own `list`."""
    listing = conformance("list", "--client")
    assert listing.returncode == 0, listing.stdout + listing.stderr
    names = re.findall(r"^\s+- (\S+)", listing.stdout, re.MULTILINE)
    assert "initialize" in names, listing.stdout
    return names


def run_scenario(scenario: str, results: Path) -> Outcome:
    out = results / scenario.replace("/", "_")
    run = conformance(
        "client",
        "--command",
        CLIENT,
        "--scenario",
        scenario,
        "--timeout",
        str(SCENARIO_TIMEOUT_MS),
        "--output-dir",
        str(out),
        timeout=SCENARIO_TIMEOUT_MS / 1000 + 30,
    )
    checks = [c for f in sorted(out.rglob("checks.json")) for c in json.loads(f.read_text())]
    return Outcome(scenario, run.returncode, checks, run.stdout + run.stderr)


def docs_table() -> dict[str, tuple[str, str]]:
    """The docs' conformance table: scenario -> (`passes` or `fails`, reason)."""
    rows = re.findall(r"^\| `([^`]+)` \| (passes|fails) \| (.*) \|$", DOCS.read_text(), re.MULTILINE)
    return {scenario: (result, reason) for scenario, result, reason in rows}


def test_every_client_scenario_passes_unless_listed_as_an_expected_failure_and_every_listed_one_fails(
    tmp_path: Path,
) -> None:
    suite_installed()
    expected: dict[str, str] = json.loads(EXPECTED_FAILURES.read_text())
    scenarios = client_scenarios()
    unknown = sorted(set(expected) - set(scenarios))
    assert not unknown, f"expected_failures.json names scenarios the suite does not have: {unknown}"
    assert sorted(docs_table()) == sorted(scenarios), f"{DOCS} must have a row for each of {scenarios}"
    with ThreadPoolExecutor(PARALLEL) as pool:
        outcomes = list(pool.map(lambda s: run_scenario(s, tmp_path), scenarios))
    outcomes = [
        run_scenario(o.scenario, tmp_path / "again") if o.scenario in TIMING and not o.passed else o for o in outcomes
    ]
    failing = [o.summary() for o in outcomes if not o.passed and o.scenario not in expected]
    fixed = [o.scenario for o in outcomes if o.passed and o.scenario in expected]
    assert not failing and not fixed, (
        "scenarios that fail and are not listed in expected_failures.json:\n"
        + "\n".join(failing or ["(none)"])
        + f"\nlisted scenarios that now pass (take them off the list and the docs' table): {fixed or '(none)'}"
    )


def test_the_docs_table_says_what_expected_failures_json_says() -> None:
    expected: dict[str, str] = json.loads(EXPECTED_FAILURES.read_text())
    table = docs_table()
    assert {s for s, (result, _) in table.items() if result == "fails"} == set(expected)
    for scenario, reason in expected.items():
        assert table[scenario] == ("fails", reason), scenario


def test_ci_installs_the_suite_version_this_test_expects() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"@modelcontextprotocol/conformance@{SUITE_VERSION}" in ci
    assert f'"version": "{SUITE_VERSION}"' in ci
    assert f"node@{NODE_MAJOR}." in ci
    assert "ORRERY_TEST_MCP_CONFORMANCE_PREFIX" in ci
