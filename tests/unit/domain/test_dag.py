"""DAG validation names every problem precisely; progress skips what can never run."""

from __future__ import annotations

from typing import Any

from orchestrator.domain import dag
from orchestrator.domain.model import DagSpec, EdgeSpec, NodeState

TOOLS = {"shell.run", "files.read", "files.write", "system.info"}


def spec(nodes: list[dict[str, Any]], edges: list[dict[str, str]] | None = None) -> DagSpec:
    return DagSpec.model_validate({"nodes": nodes, "edges": edges or []})


def node(node_id: str, tool: str = "shell.run", **args: Any) -> dict[str, Any]:
    return {"id": node_id, "commands": [{"tool": tool, "arguments": args}]}


def codes(problems: list[Any]) -> list[str]:
    return [p.code for p in problems]


def test_a_valid_dag_has_no_problems() -> None:
    s = spec([node("a"), node("b", text="${nodes.a.output.stdout}")], [{"from": "a", "to": "b"}])
    assert dag.validate(s, TOOLS) == []


def test_a_cycle_is_reported_with_its_path() -> None:
    s = spec(
        [node("a"), node("b"), node("c")],
        [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "a"}],
    )
    (p,) = dag.validate(s, TOOLS)
    assert p.code == "dag_cycle"
    assert p.extra["cycle"] == ["a", "b", "c"]
    assert "a -> b -> c -> a" in p.message


def test_duplicate_ids_and_unknown_edge_ends_are_named() -> None:
    s = spec([node("a"), node("a"), node("b")], [{"from": "a", "to": "bb"}])
    problems = dag.validate(s, TOOLS)
    assert codes(problems) == ["duplicate_node", "unknown_node"]
    assert problems[1].extra["node"] == "bb"
    assert "did you mean 'b'" in problems[1].message


def test_unknown_tool_suggests_the_nearest_names() -> None:
    (p,) = dag.validate(spec([node("a", tool="shell.rnu")]), TOOLS)
    assert p.code == "unknown_tool"
    assert p.extra["tool"] == "shell.rnu"
    assert "shell.run" in p.extra["nearest"]


def test_a_reference_to_a_non_ancestor_is_refused() -> None:
    s = spec([node("a"), node("b"), node("c", x="${nodes.b.output}")], [{"from": "a", "to": "c"}])
    (p,) = dag.validate(s, TOOLS)
    assert (p.code, p.extra["reference"]) == ("invalid_reference", "b")


def test_a_reference_to_a_missing_node_and_a_malformed_one_are_refused() -> None:
    s = spec([node("a", x="${nodes.zz.output}", y="${nodes.a.outptu}")])
    assert sorted(codes(dag.validate(s, TOOLS))) == ["invalid_reference", "unknown_node"]


def test_limits_on_nodes_and_argument_bytes() -> None:
    limits = dag.Limits(max_nodes=2, max_argument_bytes=100)
    s = spec([node("a"), node("b"), node("c", blob="x" * 200)])
    problems = dag.validate(s, TOOLS, limits)
    assert [p.extra.get("limit") for p in problems] == ["nodes_per_task", "argument_bytes"]


def _run(edges: list[tuple[str, str, str]], outcome: dict[str, NodeState]) -> dict[str, NodeState]:
    nodes = sorted({n for e in edges for n in e[:2]} | set(outcome))
    graph = dag.Graph.build(nodes, [EdgeSpec.model_validate({"from": a, "to": b, "on": on}) for a, b, on in edges])
    states = dag.initial_states(graph)
    states.update(outcome)
    states.update(dag.advance(graph, states, list(outcome)))
    return states


def test_success_edges_skip_dependents_of_a_failed_node_and_skipping_propagates() -> None:
    states = _run([("a", "b", "success"), ("b", "c", "success")], {"a": NodeState.FAILED})
    assert states["b"] is NodeState.SKIPPED
    assert states["c"] is NodeState.SKIPPED


def test_failure_edge_runs_only_after_failure() -> None:
    assert _run([("a", "fix", "failure")], {"a": NodeState.FAILED})["fix"] is NodeState.READY
    assert _run([("a", "fix", "failure")], {"a": NodeState.SUCCEEDED})["fix"] is NodeState.SKIPPED


def test_always_edge_runs_after_any_outcome_even_a_skip() -> None:
    states = _run([("a", "b", "success"), ("b", "cleanup", "always")], {"a": NodeState.FAILED})
    assert states["b"] is NodeState.SKIPPED
    assert states["cleanup"] is NodeState.READY


def test_a_node_waits_until_all_its_edges_are_decided() -> None:
    states = _run([("a", "c", "success"), ("b", "c", "success")], {"a": NodeState.SUCCEEDED})
    assert states["c"] is NodeState.PENDING
