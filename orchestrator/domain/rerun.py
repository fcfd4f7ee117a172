"""Re-running a finished task: which nodes run again and which keep what they did."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.domain.dag import Graph, dependents
from orchestrator.domain.model import NodeState


def downstream(graph: Graph, starts: Iterable[str]) -> set[str]:
    """`starts` and every node reachable from them."""
    below = dependents(graph)
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(below.get(node, ()))
    return seen


def kept_nodes(graph: Graph, states: Mapping[str, NodeState], from_node: str | None) -> set[str]:
    """The nodes a re-run keeps as they ended (state and output); every other node starts afresh.

    Without `from_node` every node runs again. With it, that node and everything downstream of
    it run again, and so does any node that was cancelled (it never finished its work) with
    everything downstream of it; the others keep their outcome (succeeded, failed or skipped)."""
    if from_node is None:
        return set()
    cancelled = [n for n in graph.nodes if not _finished(states.get(n))]
    again = downstream(graph, [from_node, *cancelled])
    return {n for n in graph.nodes if n not in again}


def _finished(state: NodeState | None) -> bool:
    return state in (NodeState.SUCCEEDED, NodeState.FAILED, NodeState.SKIPPED)
