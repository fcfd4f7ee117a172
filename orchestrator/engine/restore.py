"""Rebuild engine records from store rows (start-up and recovery)."""

from __future__ import annotations

from typing import Any

from orchestrator.domain.model import AdminState, EdgeSpec, Liveness, NodeSpec, NodeState, TaskState
from orchestrator.domain.run import TaskRun
from orchestrator.engine.records import AttemptRun, DeviceRun
from orchestrator.store.models import Attempt, Device
from orchestrator.store.repo import TaskBundle


def device_from_row(row: Device) -> DeviceRun:
    tools: dict[str, dict[str, Any]] = {t["name"]: t for t in (row.tools or []) if isinstance(t, dict)}
    return DeviceRun(
        id=row.id,
        name=row.name,
        labels=dict(row.labels or {}),
        reported_labels=dict(row.reported_labels or {}),
        platform=row.platform,
        tools=tools,
        admin=AdminState(row.admin_state),
        liveness=Liveness(row.liveness),
        fence=row.fence,
        current_batch=row.current_batch_id,
    )


def task_from_bundle(bundle: TaskBundle) -> TaskRun:
    t = bundle.task
    specs = [NodeSpec.model_validate(n.spec) for n in bundle.nodes]
    edges = [EdgeSpec.model_validate({"from": e.source, "to": e.target, "on": e.on}) for e in bundle.edges]
    run = TaskRun(t.id, specs, edges, state=TaskState(t.state), priority=t.priority)
    run.cancel_requested = run.cancel_requested or t.cancel_requested
    for n in bundle.nodes:
        rec = run.nodes[n.id]
        rec.state = NodeState(n.state)
        rec.attempts = n.attempts
        rec.output = n.output
        rec.results = list(n.results or [])
        rec.error = n.error
        rec.ready_since = n.ready_since.timestamp() if n.ready_since else None
        rec.not_before = n.not_before.timestamp() if n.not_before else None
        rec.queued_on = n.queued_on
    for a in bundle.attempts:
        if a.status == "failed":
            run.nodes[a.node_id].failed_on.add(a.device_id)
    run.recount()
    return run


def attempt_from_row(a: Attempt) -> AttemptRun:
    return AttemptRun(
        batch_id=a.batch_id,
        task_id=a.task_id,
        node_id=a.node_id,
        n=a.n,
        device_id=a.device_id,
        fence=a.fence,
        commands=list(a.commands),
        deadline=a.deadline.timestamp() if a.deadline else None,
        accepted=a.accepted_at is not None,
        cancel_reason=a.cancel_reason,
    )
