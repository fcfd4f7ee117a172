"""Row shapes for a task's nodes and edges, shared by submission, planning and DAG edits."""

from __future__ import annotations

from typing import Any

from orchestrator.domain.model import DagSpec


def node_rows(task_id: str, spec: DagSpec, start: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(node rows, edge rows) for `spec`; node positions count from `start`."""
    nodes = [
        {
            "task_id": task_id,
            "id": n.id,
            "position": start + i,
            "kind": n.kind.value,
            "spec": n.model_dump(mode="json"),
            "state": "pending",
            "attempts": 0,
        }
        for i, n in enumerate(spec.nodes)
    ]
    edges = [{"task_id": task_id, "source": e.source, "target": e.target, "on": e.on.value} for e in spec.edges]
    return nodes, edges
