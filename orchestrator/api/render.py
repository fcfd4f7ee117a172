"""Store rows to API response models."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Response
from pydantic import BaseModel, TypeAdapter

from orchestrator.api.schemas import AttemptOut, DeviceOut, EdgeOut, NodeOut, TaskOut
from orchestrator.domain.lifecycle import device_state
from orchestrator.domain.model import AdminState, Liveness
from orchestrator.store.models import Device, Task
from orchestrator.store.repo import VIEW_ATTEMPT_COLUMNS, VIEW_NODE_COLUMNS, TaskBundle, TaskRows


def json_answer(model: BaseModel, status: int = 200) -> Response:
    """A response model's JSON, as FastAPI would send it, in one pass. Given the model itself,
    FastAPI dumps it to Python objects, validates those against the response model and then
    serializes them: three passes over a 2,000-node task where one does (the model was
    validated when it was built). The route keeps its `response_model` for the OpenAPI document."""
    return Response(model.model_dump_json(by_alias=True), status, media_type="application/json")


def task_out(task: Task, counts: dict[str, int] | None = None) -> TaskOut:
    return TaskOut(
        id=task.id,
        name=task.name,
        state=task.state,
        priority=task.priority,
        labels=task.labels or {},
        request=task.request,
        created_at=task.created_at,
        finished_at=task.finished_at,
        error=task.error,
        dag_version=task.dag_version or 1,
        rerun_of=task.rerun_of,
        node_counts=counts or {},
    )


@dataclass(frozen=True)
class NewTask:
    """A task just created, as the rows handed to the engine to store: the answer to its submission
    is rendered from them (building thousands of ORM objects only to read them back costs more
    than the checks of the DAG)."""

    task: dict[str, Any]
    nodes: list[dict[str, Any]]  # without output, results and error unless a re-run kept them
    edges: list[dict[str, Any]]


_NODES = TypeAdapter(list[NodeOut])
_EDGES = TypeAdapter(list[EdgeOut])


def task_detail(bundle: TaskBundle | TaskRows | NewTask) -> TaskOut:
    attempts: list[dict[str, Any]]
    if isinstance(bundle, NewTask):
        task = Task(**bundle.task)
        rows, edges, attempts = bundle.nodes, bundle.edges, []
    elif isinstance(bundle, TaskRows):
        task, rows, attempts = Task(**bundle.task), bundle.nodes, bundle.attempts
        edges = [{"source": e["source"], "target": e["target"], "on": e["on"]} for e in bundle.edges]
    else:
        task = bundle.task
        rows = [{f: getattr(n, f) for f in VIEW_NODE_COLUMNS} for n in bundle.nodes]
        edges = [{"source": e.source, "target": e.target, "on": e.on} for e in bundle.edges]
        attempts = [{f: getattr(a, f) for f in VIEW_ATTEMPT_COLUMNS} for a in bundle.attempts]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    out = task_out(task, counts)
    by_node: dict[str, list[AttemptOut]] = {}
    for a in attempts:
        by_node.setdefault(a["node_id"], []).append(
            AttemptOut(
                n=a["n"],
                device_id=a["device_id"],
                batch_id=a["batch_id"],
                status=a["status"],
                started_at=a["started_at"],
                accepted_at=a["accepted_at"],
                ended_at=a["ended_at"],
                commands=a["commands"] or [],
                results=a["results"] or [],
                error=a["error"],
            )
        )
    nodes = []
    for n in rows:
        spec: dict[str, Any] = n["spec"]
        nodes.append(
            {
                "id": n["id"],
                "kind": n["kind"],
                "state": n["state"],
                "placement": spec.get("placement", {}),
                "commands": spec.get("commands", []),
                "instruction": spec.get("instruction"),
                "retry": spec.get("retry", {}),
                "priority": spec.get("priority", 0),
                "queue_timeout_s": spec.get("queue_timeout_s"),
                "timeout_s": spec.get("timeout_s"),
                "queued_on": n.get("queued_on"),
                "attempts": by_node.get(n["id"], []),
                "output": n.get("output"),
                "error": n.get("error"),
                "started_at": n.get("started_at"),
                "finished_at": n.get("finished_at"),
            }
        )
    out.nodes = _NODES.validate_python(nodes)  # one validation of the list, not one call per node
    out.edges = _EDGES.validate_python(edges)
    return out


def device_out(
    row: Device,
    queue_length: int,
    connected: bool,
    last_frame_mono: float | None,
    current: tuple[str, str] | None = None,
) -> DeviceOut:
    """`current`: (task id, node id) of the batch the device runs now, if known."""
    last_seen = row.last_seen
    if last_frame_mono is not None:
        last_seen = datetime.fromtimestamp(time.time() - (time.monotonic() - last_frame_mono), UTC)
    state = device_state(
        AdminState(row.admin_state), Liveness(row.liveness), row.current_batch_id is not None, queue_length
    )
    if row.current_batch_id is None:
        current = None
    return DeviceOut(
        id=row.id,
        name=row.name,
        state=state.value,
        admin_state=row.admin_state,
        liveness=row.liveness,
        labels={**(row.reported_labels or {}), **(row.labels or {})},
        platform=row.platform,
        info=row.info or {},
        tools=row.tools or [],
        current_batch=row.current_batch_id,
        current_task_id=current[0] if current else None,
        current_node_id=current[1] if current else None,
        queue_length=queue_length,
        last_seen=last_seen,
        connected=connected,
        created_at=row.created_at,
    )
