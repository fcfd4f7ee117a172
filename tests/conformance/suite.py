"""The official MCP conformance suite (`@modelcontextprotocol/conformance`), as the tests run it:
where `.ci/run` installs it with the Node 22 it needs, how a scenario is run and judged, and the
one rule both sides' tests hold (each scenario passes unless listed as an expected failure, and
each listed one still fails, so a list cannot go stale)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
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
INSTALL = f"npm install --prefix {PREFIX} node@{NODE_MAJOR} @modelcontextprotocol/conformance@{SUITE_VERSION}"
# Every expected failure of both sides, with its reason: {"client": {scenario: reason}, "server": ...}.
EXPECTED_FAILURES = Path(__file__).with_name("expected_failures.json")
# Scenarios run side by side, a few at a time: each is a node process (the suite, and its test
# server or client) and the other side, a few seconds of CPU in all.
PARALLEL = 4


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


def scenarios(side: str) -> list[str]:
    """The suite's scenarios of one side (`client` or `server`), from its own `list`."""
    listing = conformance("list", f"--{side}")
    assert listing.returncode == 0, listing.stdout + listing.stderr
    names = re.findall(r"^\s+- (\S+)", listing.stdout, re.MULTILINE)
    assert names, listing.stdout
    return names


def run(scenario: str, results: Path, *args: str, timeout_s: float) -> Outcome:
    """`conformance <args> --scenario <scenario>`, its checks read from its output directory."""
    out = results / scenario.replace("/", "_")
    done = conformance(*args, "--scenario", scenario, "--output-dir", str(out), timeout=timeout_s)
    checks = [c for f in sorted(out.rglob("checks.json")) for c in json.loads(f.read_text())]
    return Outcome(scenario, done.returncode, checks, done.stdout + done.stderr)


def run_all(names: list[str], one: Callable[[str], Outcome]) -> list[Outcome]:
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(one, names))


def expected_failures(side: str) -> dict[str, str]:
    """The scenarios of one side (`client` or `server`) expected to fail, with their reasons."""
    listed: dict[str, dict[str, str]] = json.loads(EXPECTED_FAILURES.read_text())
    return listed[side]


def hold_expected_failures(outcomes: list[Outcome], expected: dict[str, str], listed_in: Path) -> None:
    """Each scenario passes unless `listed_in` names it; each it names still fails."""
    failing = [o.summary() for o in outcomes if not o.passed and o.scenario not in expected]
    fixed = [o.scenario for o in outcomes if o.passed and o.scenario in expected]
    assert not failing and not fixed, (
        f"scenarios that fail and are not listed in {listed_in.name}:\n"
        + "\n".join(failing or ["(none)"])
        + f"\nlisted scenarios that now pass (take them off the list and the docs' table): {fixed or '(none)'}"
    )


def docs_table(page: Path, heading: str) -> dict[str, tuple[str, str]]:
    """A conformance table of `page` (the one after the line `heading`): scenario -> (`passes`
    or `fails`, reason)."""
    text = page.read_text()
    assert heading in text, f"{page} has no line {heading!r}"
    section = text[text.index(heading) :]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        rows.extend(re.findall(r"^\| `([^`]+)` \| (passes|fails) \| (.*) \|$", line))
    return {scenario: (result, reason) for scenario, result, reason in rows}


def hold_docs_table(side: str, page: Path, heading: str) -> None:
    """The docs' table lists as failing exactly the scenarios of `side` that expected_failures.json
    lists, each with the same reason."""
    expected = expected_failures(side)
    table = docs_table(page, heading)
    assert {s for s, (result, _) in table.items() if result == "fails"} == set(expected)
    for scenario, reason in expected.items():
        assert table[scenario] == ("fails", reason), scenario
