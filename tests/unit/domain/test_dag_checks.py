"""Validation names every independent problem of a DAG at once, and what a typo probably meant."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.domain import dag, templates
from orchestrator.domain.model import DagSpec, unknown_field

TOOLS = {"shell.run", "files.read"}


def spec(nodes: list[dict[str, Any]], edges: list[dict[str, str]] | None = None) -> DagSpec:
    return DagSpec.model_validate({"nodes": nodes, "edges": edges or []})


def node(node_id: str, tool: str = "shell.run", **args: Any) -> dict[str, Any]:
    return {"id": node_id, "commands": [{"tool": tool, "arguments": args}]}


@pytest.mark.parametrize(
    ("text", "meant"),
    [
        ("${node.a.output}", "${nodes.a.output}"),
        ("echo ${node.a.output.stdout} done", "${nodes.a.output.stdout}"),
        ("${Nodes.a.output}", "${nodes.a.output}"),
        ("${nodse.a.output}", "${nodes.a.output}"),
        ("${nodes.a.outptu}", "${nodes.a.output}"),
        ("${node.a.results[1].result}", "${nodes.a.results[1].result}"),
        ("${nodes.a.reslts[0].result}", "${nodes.a.results[0].result}"),
        ("${node.a}", "${nodes.a.output}"),
    ],
)
def test_a_misspelt_reference_is_refused_with_the_one_meant(text: str, meant: str) -> None:
    s = spec([node("a"), node("b", text=text)], [{"from": "a", "to": "b"}])
    (p,) = dag.validate(s, TOOLS)
    assert (p.code, p.extra["node"], p.extra["suggestion"]) == ("invalid_reference", "b", meant)
    assert f"did you mean {meant}?" in p.message


@pytest.mark.parametrize(
    "text", ["${HOME}", "${PATH:-/bin}", "${x.y}", "${1}", "$nodes.a.output", "${nodes}", "cost: $5 {a.b}"]
)
def test_shell_text_that_is_no_reference_passes_through(text: str) -> None:
    assert dag.validate(spec([node("a", argv=["sh", "-c", text])]), TOOLS) == []


def test_an_unknown_edge_end_a_cycle_and_bad_references_are_reported_together() -> None:
    s = spec(
        [node("a", x="${nodes.b.outptu}"), node("b", y="${nodes.zz.output}"), node("c", tool="shell.rnu")],
        [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}, {"from": "b", "to": "nowhere"}],
    )
    problems = dag.validate(s, TOOLS)
    assert sorted(p.code for p in problems) == [
        "dag_cycle",
        "invalid_reference",
        "unknown_node",
        "unknown_node",
        "unknown_tool",
    ]
    assert next(p for p in problems if p.code == "dag_cycle").extra["cycle"] in (["a", "b"], ["b", "a"])


def test_an_edge_to_an_unknown_node_is_left_out_of_the_ancestor_check_only() -> None:
    s = spec([node("a"), node("b", x="${nodes.a.output}")], [{"from": "a", "to": "b"}, {"from": "zz", "to": "b"}])
    assert [p.code for p in dag.validate(s, TOOLS)] == ["unknown_node"]


@pytest.mark.parametrize(
    ("loc", "said"),
    [
        (("nodes", 0, "placment"), "unknown field 'placment'; did you mean 'placement'?"),
        (("nodes", 0, "retry", "max_atempts"), "unknown field 'max_atempts'; did you mean 'max_attempts'?"),
        (("nodes", 0, "commands", 2, "timout_s"), "unknown field 'timout_s'; did you mean 'timeout_s'?"),
        (("nodes", 0, "verify", 0, "tol"), "unknown field 'tol'; did you mean 'tool'?"),
        (("nodes", 0, "placement", "platfrom"), "unknown field 'platfrom'; did you mean 'platform'?"),
        (("nodes", 0, "for_each", "canry"), "unknown field 'canry'; did you mean 'canary'?"),
        (("edges", 3, "form"), "unknown field 'form'; did you mean 'from'?"),
        (("edgse",), "unknown field 'edgse'; did you mean 'edges'?"),
        (("nodes", 0, "zzz"), "unknown field 'zzz' (allowed: id, kind, placement, commands, instruction, "),
    ],
)
def test_a_misspelt_key_names_the_field_meant_at_every_level(loc: tuple[Any, ...], said: str) -> None:
    message = unknown_field(DagSpec, loc)
    assert message is not None and message.startswith(said)


def test_a_key_inside_free_form_data_is_not_judged() -> None:
    assert unknown_field(DagSpec, ("nodes", 0, "commands", 0, "arguments", "argvv")) is None
    assert unknown_field(DagSpec, ("nodes", 0, "placement", "labels", "x")) is None


def test_suggestion_is_none_when_nothing_valid_is_near() -> None:
    assert templates.suggestion("${nodes.a.zzz}") is None
