"""Accepting a task: idempotency, validation against the fleet, one durable insert."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from orchestrator.api.errors import ApiError
from orchestrator.api.schemas import TaskCreate
from orchestrator.config import Settings
from orchestrator.domain import dag, placement
from orchestrator.domain.model import DagSpec, NodeKind, TaskState
from orchestrator.domain.problems import DomainError, Problem
from orchestrator.domain.run import TaskRun
from orchestrator.engine.core import Engine, iso, utc
from orchestrator.engine.records import TaskCreated
from orchestrator.ids import new_id
from orchestrator.store.models import Edge, Node, Task
from orchestrator.store.repo import ChangeSet, Store, TaskBundle, WriteConflict


def body_hash(body: TaskCreate) -> str:
    canonical = json.dumps(body.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def limits_of(settings: Settings) -> dag.Limits:
    return dag.Limits(max_nodes=settings.max_nodes_per_task, max_argument_bytes=settings.max_argument_bytes)


def validate_for_fleet(spec: DagSpec, engine: Engine, settings: Settings) -> list[Problem]:
    """Structural problems first; then every tool node must fit some enrolled device."""
    problems = dag.validate(spec, engine.known_tools(), limits_of(settings))
    if problems:
        return problems
    views = engine.device_views()
    for node in spec.nodes:
        if node.kind is NodeKind.TOOL and not placement.could_ever_run(node, views):
            problems.append(placement.no_capable_device(node, views))
    return problems


async def create_task(
    store: Store, engine: Engine, settings: Settings, body: TaskCreate, idempotency_key: str | None
) -> tuple[str, TaskBundle | None]:
    """Store a new task and hand it to the engine. Returns its id and, when it was created now,
    the stored rows (the caller can answer from them without reading the task back)."""
    digest = body_hash(body)
    if idempotency_key:
        existing = await store.find_task_by_idempotency_key(idempotency_key)
        if existing is not None:
            return _same_or_conflict(existing, digest)
    llm = bool(settings.llm_base_url and settings.llm_model)
    if body.request is not None and not llm:
        raise ApiError(
            422,
            "planner_unavailable",
            "this server has no LLM configured (ORRERY_LLM_BASE_URL, ORRERY_LLM_MODEL); submit an explicit 'dag'",
        )
    spec = body.dag
    assert spec is not None
    if not llm and any(n.kind is NodeKind.AGENT for n in spec.nodes):
        raise ApiError(
            422,
            "planner_unavailable",
            "agent nodes need an LLM and this server has none configured; use tool nodes",
        )
    problems = validate_for_fleet(spec, engine, settings)
    if problems:
        raise DomainError(problems)
    task_id = new_id("task")
    now = time.time()
    rows = task_rows(task_id, body, spec, now, idempotency_key, digest)
    changes = ChangeSet()
    changes.insert(Task, rows["task"])
    for node in rows["nodes"]:
        changes.insert(Node, node)
    for edge in rows["edges"]:
        changes.insert(Edge, edge)
    changes.event(rows["event"])
    try:
        await store.write(changes)
    except WriteConflict:
        if idempotency_key:
            existing = await store.find_task_by_idempotency_key(idempotency_key)
            if existing is not None:
                return _same_or_conflict(existing, digest)
        raise
    engine.notify(TaskCreated(task_id, TaskRun(task_id, spec.nodes, spec.edges, priority=body.priority)))
    bundle = TaskBundle(
        Task(**rows["task"]),
        [Node(**n, output=None, results=None, error=None) for n in rows["nodes"]],
        [Edge(**e) for e in rows["edges"]],
        [],
    )
    return task_id, bundle


def _same_or_conflict(existing: Task, digest: str) -> tuple[str, TaskBundle | None]:
    if existing.body_hash != digest:
        raise ApiError(
            409,
            "conflict",
            f"Idempotency-Key was already used for task {existing.id} with a different body",
            task_id=existing.id,
        )
    return existing.id, None


def task_rows(
    task_id: str, body: TaskCreate, spec: DagSpec, now: float, idem: str | None, digest: str
) -> dict[str, Any]:
    name = body.name or f"task-{task_id[-6:]}"
    return {
        "task": {
            "id": task_id,
            "name": name,
            "state": TaskState.RUNNING.value,
            "priority": body.priority,
            "labels": body.labels,
            "request": body.request,
            "replan": body.replan,
            "idempotency_key": idem,
            "body_hash": digest,
            "created_at": utc(now),
            "started_at": utc(now),
        },
        "nodes": [
            {
                "task_id": task_id,
                "id": n.id,
                "position": i,
                "kind": n.kind.value,
                "spec": n.model_dump(mode="json"),
                "state": "pending",
                "attempts": 0,
            }
            for i, n in enumerate(spec.nodes)
        ],
        "edges": [{"task_id": task_id, "source": e.source, "target": e.target, "on": e.on.value} for e in spec.edges],
        "event": {
            "task_id": task_id,
            "type": "task.state",
            "node_id": None,
            "data": {"task_id": task_id, "state": "running", "at": iso(now)},
            "at": utc(now),
        },
    }
