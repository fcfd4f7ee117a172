"""Rebuild engine records from store rows (start-up and recovery). Builds and returns them; what
they mean for the running engine (timers, queues, agents to stop) is the engine's to settle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.domain.model import AdminState, EdgeSpec, Liveness, NodeSpec, NodeState, TaskState
from orchestrator.domain.run import TaskRun
from orchestrator.engine.records import AttemptKind, AttemptRun, DeviceRun
from orchestrator.store.models import Attempt, Device
from orchestrator.store.repo import RuntimeSnapshot, TaskBundle
from protocol.messages import Command


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
        epoch=row.session_epoch,
        token_hash=row.token_hash,
        cordon_reason=row.cordon_reason,
    )


def task_from_bundle(bundle: TaskBundle) -> TaskRun:
    t = bundle.task
    specs = [NodeSpec.model_validate(n.spec) for n in bundle.nodes]
    edges = [EdgeSpec.model_validate({"from": e.source, "to": e.target, "on": e.on}) for e in bundle.edges]
    run = TaskRun(t.id, specs, edges, state=TaskState(t.state), priority=t.priority)
    run.cancel_requested = run.cancel_requested or t.cancel_requested
    run.request = t.request
    run.replan = t.replan
    run.version = t.dag_version
    run.replans_used = t.replans_used
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
        if a.status == "failed" and a.kind != "step" and a.node_id in run.nodes:
            rec = run.nodes[a.node_id]
            rec.failed_on.add(a.device_id)
            if a.results and all(r.get("status") == "skipped" for r in a.results):
                rec.unstarted += 1  # the device turned it away unrun (see TaskRun.attempt_ended)
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
        commands=[Command.model_validate(c) for c in a.commands],
        deadline=a.deadline.timestamp() if a.deadline else None,
        started=a.started_at.timestamp(),
        accepted=a.accepted_at is not None,
        sent=True,  # it may have reached the device before the crash
        cancel_reason=a.cancel_reason,
        kind=AttemptKind(a.kind),
        parent=a.parent_batch_id,
    )


@dataclass
class Recovered:
    """What the store holds of the runtime: devices, unfinished tasks with their open attempts,
    and the tasks whose planning was under way."""

    devices: list[DeviceRun] = field(default_factory=list)
    tasks: list[TaskRun] = field(default_factory=list)
    attempts: list[AttemptRun] = field(default_factory=list)
    planning: list[tuple[str, str]] = field(default_factory=list)  # (task id, request)


def load(snap: RuntimeSnapshot, now: float) -> Recovered:
    """Records of everything in `snap`. Devices that were connected are `recovering`: nobody is
    known to be connected yet, so they take no new work until heard from, and get a full
    heartbeat timeout before being judged lost (peers.md: restart grace)."""
    out = Recovered()
    for row in snap.devices:
        dev = device_from_row(row)
        if dev.liveness in (Liveness.ONLINE, Liveness.SUSPECT):
            dev.liveness = Liveness.SUSPECT
            dev.recovering = True
            dev.heard_at = now
        out.devices.append(dev)
    for bundle in snap.tasks:
        if bundle.task.state == TaskState.PLANNING:
            out.planning.append((bundle.task.id, bundle.task.request or ""))
            continue
        out.tasks.append(task_from_bundle(bundle))
        out.attempts += [attempt_from_row(a) for a in bundle.attempts if a.ended_at is None]
    by_id = {a.batch_id: a for a in out.attempts}
    for att in out.attempts:
        parent = by_id.get(att.parent or "")
        if att.kind is AttemptKind.STEP and parent is not None:
            parent.step = att.batch_id
    return out


def held_when_stored(run: TaskRun, node_id: str) -> bool:
    """Was this failed node held for a re-plan when the store was written? Its failure was not
    passed on: a successor still waits on it, or every node is done and the task is still
    running, which only a held failure prevents (its successors, if any, were decided by
    other edges)."""
    outgoing = run.graph.outgoing.get(node_id, [])
    if any(run.nodes[e.target].state is NodeState.PENDING for e in outgoing):
        return True
    return all(r.state.terminal for r in run.nodes.values())
