"""Which nodes a re-run keeps (pure rule)."""

from __future__ import annotations

from orchestrator.domain.dag import Graph
from orchestrator.domain.model import EdgeSpec, NodeState
from orchestrator.domain.rerun import kept_nodes

S, F, K, C = NodeState.SUCCEEDED, NodeState.FAILED, NodeState.SKIPPED, NodeState.CANCELLED


def graph(nodes: str, *edges: str) -> Graph:
    return Graph.build(list(nodes), [EdgeSpec.model_validate({"from": e[0], "to": e[1]}) for e in edges])


def test_a_whole_rerun_keeps_nothing() -> None:
    assert kept_nodes(graph("abc", "ab", "bc"), {"a": S, "b": S, "c": F}, None) == set()


def test_from_a_node_keeps_what_is_not_downstream_of_it() -> None:
    g = graph("abcd", "ab", "bc", "ad")  # a -> b -> c, a -> d
    assert kept_nodes(g, {"a": S, "b": S, "c": F, "d": S}, "c") == {"a", "b", "d"}
    assert kept_nodes(g, {"a": S, "b": F, "c": K, "d": S}, "b") == {"a", "d"}
    assert kept_nodes(g, {"a": S, "b": S, "c": S, "d": S}, "a") == set()


def test_cancelled_nodes_and_what_follows_them_run_again() -> None:
    g = graph("abcd", "ab", "bc", "ad")
    assert kept_nodes(g, {"a": S, "b": C, "c": K, "d": F}, "d") == {"a"}
