"""DAG edits touch only pending nodes and roll back as a whole when anything is wrong."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from orchestrator.domain import edits
from orchestrator.domain.model import EdgeSpec, NodeSpec, NodeState
from orchestrator.domain.problems import DomainError

TOOLS = {"shell.run", "files.read"}
ADAPTER: TypeAdapter[list[Any]] = TypeAdapter(list[edits.Edit])


def node(node_id: str, **args: Any) -> NodeSpec:
    return NodeSpec.model_validate({"id": node_id, "commands": [{"tool": "shell.run", "arguments": args}]})


def edge(a: str, b: str, on: str = "success") -> EdgeSpec:
    return EdgeSpec.model_validate({"from": a, "to": b, "on": on})


NODES = [node("a"), node("b"), node("c")]
EDGES = [edge("a", "b"), edge("b", "c")]
STATES = {"a": NodeState.FAILED, "b": NodeState.PENDING, "c": NodeState.PENDING}


def apply(raw: list[dict[str, Any]]) -> edits.EditResult:
    return edits.apply(NODES, EDGES, STATES, ADAPTER.validate_python(raw), TOOLS)


def test_a_compensating_node_can_be_added_behind_a_failed_one() -> None:
    out = apply(
        [
            {"op": "add_node", "node": {"id": "fix", "commands": [{"tool": "files.read", "arguments": {"path": "x"}}]}},
            {"op": "add_edge", "edge": {"from": "a", "to": "fix", "on": "failure"}},
        ]
    )
    assert [n.id for n in out.nodes] == ["a", "b", "c", "fix"]
    assert edge("a", "fix", "failure") in out.edges
    assert out.added == ["fix"]


def test_pending_nodes_can_be_changed_or_removed_with_their_edges() -> None:
    out = apply(
        [
            {"op": "update_node", "node": {"id": "b", "commands": [{"tool": "shell.run", "arguments": {"x": 1}}]}},
            {"op": "remove_node", "id": "c"},
        ]
    )
    assert [n.id for n in out.nodes] == ["a", "b"] and out.edges == [edge("a", "b")]
    assert out.changed == ["b"] and out.removed == ["c"]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ([{"op": "update_node", "node": {"id": "a", "commands": [{"tool": "shell.run"}]}}], "edit_refused"),
        ([{"op": "remove_node", "id": "a"}], "edit_refused"),
        ([{"op": "add_edge", "edge": {"from": "c", "to": "a"}}], "edit_refused"),
        ([{"op": "add_edge", "edge": {"from": "c", "to": "b"}}], "dag_cycle"),
        ([{"op": "add_node", "node": {"id": "n", "commands": [{"tool": "nope.tool"}]}}], "unknown_tool"),
        (
            [
                {
                    "op": "add_node",
                    "node": {"id": "n", "commands": [{"tool": "shell.run", "arguments": {"x": "${nodes.c.output}"}}]},
                }
            ],
            "invalid_reference",
        ),
        ([{"op": "remove_edge", "from": "a", "to": "c"}], "unknown_edge"),
    ],
)
def test_an_invalid_edit_list_is_refused_whole(raw: list[dict[str, Any]], code: str) -> None:
    before = (list(NODES), list(EDGES))
    with pytest.raises(DomainError) as info:
        apply([{"op": "add_node", "node": {"id": "ok", "commands": [{"tool": "shell.run"}]}}, *raw])
    assert code in [p.code for p in info.value.problems]
    assert before == (NODES, EDGES)
