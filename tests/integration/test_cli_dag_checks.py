"""`orrery validate` names every problem of a DAG file in one round: misspelt references and keys
with what was probably meant, and the file:line:column of a misspelt key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import Fleet, run_cli


@pytest.fixture(scope="module")
def fleet(shared_fleet: Fleet) -> Fleet:
    shared_fleet.agent("dc-box", {"role": "dc"})
    return shared_fleet


def orrery(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(fleet, *args, timeout=60)


def test_a_misspelt_reference_is_refused_with_the_meant_one_and_shell_text_passes(fleet: Fleet, tmp_path: Path) -> None:
    dag = tmp_path / "dag.yaml"
    dag.write_text(
        "nodes:\n"
        "  - id: a\n"
        "    placement: {labels: {role: dc}}\n"
        "    commands: [{tool: shell.run, arguments: {argv: [echo, hi]}}]\n"
        "  - id: b\n"
        "    placement: {labels: {role: dc}}\n"
        "    commands: [{tool: shell.run, arguments: {argv: [echo, '${node.a.output.stdout}']}}]\n"
        "edges: [{from: a, to: b}]\n"
    )
    result = orrery(fleet, "validate", str(dag))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error invalid_reference node b:" in result.stdout
    assert "did you mean ${nodes.a.output.stdout}?" in result.stdout
    # Shell variables are not references: `${HOME}` and `${x.y}` (no `nodes`-like word) pass through.
    dag.write_text(dag.read_text().replace("'${node.a.output.stdout}'", "'${HOME} ${PATH} ${x.y}'"))
    passed = orrery(fleet, "validate", str(dag))
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_validate_lists_structural_tool_and_argument_problems_in_one_round(fleet: Fleet, tmp_path: Path) -> None:
    dag = tmp_path / "dag.yaml"
    dag.write_text(
        "nodes:\n"
        "  - id: a\n"
        "    placement: {labels: {role: dc}}\n"
        "    commands: [{tool: shell.run, arguments: {argv: [echo, '${nodes.c.outptu}']}}]\n"
        "  - id: b\n"
        "    placement: {labels: {role: dc}}\n"
        "    commands: [{tool: shell.rnu, arguments: {argv: [ls]}}]\n"
        "  - id: c\n"
        "    placement: {labels: {role: dc}}\n"
        "    commands: [{tool: shell.run, arguments: {argv: not-a-list}}]\n"
        "  - id: d\n"
        "    placement: {labels: {role: dc}}\n"
        "    commands: [{tool: files.read, arguments: {}}]\n"
        "edges: [{from: a, to: c}, {from: c, to: a}, {from: d, to: e}]\n"
    )
    result = orrery(fleet, "validate", str(dag), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    problems = json.loads(result.stdout)["problems"]
    found = sorted((p["code"], p.get("node_id") or "") for p in problems)
    assert found == [
        ("dag_cycle", ""),
        ("invalid_arguments", "c"),
        ("invalid_arguments", "d"),
        ("invalid_reference", "a"),
        ("unknown_node", "e"),
        ("unknown_tool", "b"),
    ], problems
    human = orrery(fleet, "validate", str(dag))
    assert "error unknown_node node e: edge d -> e names node 'e'" in human.stdout
    assert "did you mean ${nodes.c.output}?" in human.stdout and "did you mean shell.run?" in human.stdout


def test_misspelt_keys_at_every_level_name_the_field_meant_and_where_it_is(fleet: Fleet, tmp_path: Path) -> None:
    dag = tmp_path / "dag.yaml"
    dag.write_text(
        "nodes:\n"
        "  - id: a\n"
        "    placment: {labels: {role: dc}}\n"
        "    retry: {max_atempts: 2}\n"
        "    commands:\n"
        "      - {tool: shell.run, argumnets: {argv: [ls]}}\n"
        "edges: [{from: a, too: a}]\n"
    )
    result = orrery(fleet, "validate", str(dag))
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert f"{dag}:3:5: body.dag.nodes.0.placment: unknown field 'placment'; did you mean 'placement'?" in out
    assert f"{dag}:4:13: body.dag.nodes.0.retry.max_atempts: unknown field 'max_atempts'; did you mean " in out
    assert f"{dag}:6:27: body.dag.nodes.0.commands.0.argumnets: unknown field 'argumnets'; did you mean " in out
    assert f"{dag}:7:19: body.dag.edges.0.too: unknown field 'too'; did you mean 'to'?" in out
    assert "Extra inputs" not in out and "Traceback" not in result.stderr
