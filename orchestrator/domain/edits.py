"""Editing a running task's DAG (re-planning): only the part not yet run, validated as a whole.

Edits are applied to a copy; if anything is wrong the copy is thrown away and the problems are
returned, so a DAG is never left half-edited (SPEC section 6: rolled back if invalid).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.domain import dag
from orchestrator.domain.model import DagSpec, EdgeSpec, NodeSpec, NodeState
from orchestrator.domain.problems import DomainError, Problem


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AddNode(_Op):
    op: Literal["add_node"] = "add_node"
    node: NodeSpec


class UpdateNode(_Op):
    op: Literal["update_node"] = "update_node"
    node: NodeSpec


class RemoveNode(_Op):
    op: Literal["remove_node"] = "remove_node"
    id: str


class AddEdge(_Op):
    op: Literal["add_edge"] = "add_edge"
    edge: EdgeSpec


class RemoveEdge(_Op):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    op: Literal["remove_edge"] = "remove_edge"
    source: str = Field(alias="from")
    target: str = Field(alias="to")


Edit = Annotated[AddNode | UpdateNode | RemoveNode | AddEdge | RemoveEdge, Field(discriminator="op")]


class EditList(BaseModel):
    """What a re-planner returns: the edits, and why (both stored with the new version)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = ""
    edits: list[Edit] = Field(default_factory=list, max_length=200)


@dataclass
class EditResult:
    nodes: list[NodeSpec]
    edges: list[EdgeSpec]
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)


def apply(
    nodes: list[NodeSpec],
    edges: list[EdgeSpec],
    states: Mapping[str, NodeState],
    edits: list[AddNode | UpdateNode | RemoveNode | AddEdge | RemoveEdge],
    known_tools: Collection[str],
    limits: dag.Limits | None = None,
) -> EditResult:
    """The DAG after `edits`, or `DomainError` naming every problem (nothing is changed then)."""
    by_id = {n.id: n for n in nodes}
    order = [n.id for n in nodes]
    edge_list = list(edges)
    result = EditResult([], [])
    problems: list[Problem] = []

    def editable(node_id: str, what: str) -> bool:
        state = states.get(node_id)
        if state is not None and state is not NodeState.PENDING:
            problems.append(
                Problem(
                    "edit_refused",
                    f"{what}: node '{node_id}' is {state.value}; only pending nodes (not yet run) may change",
                    {"node": node_id, "state": state.value},
                )
            )
            return False
        return True

    for i, edit in enumerate(edits):
        where = f"edit {i} ({edit.op})"
        if isinstance(edit, AddNode):
            if edit.node.id in by_id:
                problems.append(
                    Problem("duplicate_node", f"{where}: node '{edit.node.id}' already exists; use update_node")
                )
                continue
            by_id[edit.node.id] = edit.node
            order.append(edit.node.id)
            result.added.append(edit.node.id)
        elif isinstance(edit, UpdateNode):
            if edit.node.id not in by_id:
                problems.append(Problem("unknown_node", f"{where}: no node '{edit.node.id}' to update"))
            elif editable(edit.node.id, where):
                by_id[edit.node.id] = edit.node
                result.changed.append(edit.node.id)
        elif isinstance(edit, RemoveNode):
            if edit.id not in by_id:
                problems.append(Problem("unknown_node", f"{where}: no node '{edit.id}' to remove"))
            elif editable(edit.id, where):
                del by_id[edit.id]
                order.remove(edit.id)
                edge_list = [e for e in edge_list if edit.id not in (e.source, e.target)]
                result.removed.append(edit.id)
        elif isinstance(edit, AddEdge):
            if edit.edge.target in by_id and editable(edit.edge.target, where):
                edge_list.append(edit.edge)
            elif edit.edge.target not in by_id:
                problems.append(Problem("unknown_node", f"{where}: no node '{edit.edge.target}' to point at"))
        else:
            present = [e for e in edge_list if (e.source, e.target) == (edit.source, edit.target)]
            if not present:
                problems.append(Problem("unknown_edge", f"{where}: there is no edge {edit.source} -> {edit.target}"))
            elif editable(edit.target, where):
                edge_list = [e for e in edge_list if e not in present]
    if problems:
        raise DomainError(problems)
    result.nodes = [by_id[n] for n in order]
    result.edges = edge_list
    spec = DagSpec(nodes=result.nodes, edges=result.edges)
    new_tools = {t for n in edits if isinstance(n, AddNode | UpdateNode) for t in n.node.tools()}
    problems = dag.validate(spec, set(known_tools) | (_tools_in(nodes) - new_tools), limits or dag.Limits())
    if problems:
        raise DomainError(problems)
    return result


def _tools_in(nodes: list[NodeSpec]) -> set[str]:
    """Tools already in the DAG stay valid even if their device has gone since."""
    return {t for n in nodes for t in n.tools()}
