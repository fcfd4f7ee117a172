"""Rebuild engine records from store rows (start-up and recovery)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.domain.model import AdminState, EdgeSpec, Liveness, NodeSpec, NodeState, TaskState
from orchestrator.domain.run import TaskRun
from orchestrator.engine.records import AttemptRun, DeviceRun
from orchestrator.engine.times import utc
from orchestrator.store.models import Attempt, Device
from orchestrator.store.repo import RuntimeSnapshot, TaskBundle
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from orchestrator.engine.core import Engine


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
        commands=list(a.commands),
        deadline=a.deadline.timestamp() if a.deadline else None,
        accepted=a.accepted_at is not None,
        cancel_reason=a.cancel_reason,
        kind=a.kind,
        parent=a.parent_batch_id,
        started=a.started_at.timestamp(),
    )


def attempt_row(att: AttemptRun, now: float, status: str) -> dict[str, Any]:
    """The stored row of a new attempt (or an agent attempt's step batch)."""
    return {
        "batch_id": att.batch_id,
        "parent_batch_id": att.parent,
        "kind": att.kind,
        "task_id": att.task_id,
        "node_id": att.node_id,
        "n": att.n,
        "device_id": att.device_id,
        "fence": att.fence,
        "commands": att.commands,
        "status": status,
        "deadline": utc(att.deadline) if att.deadline else None,
        "started_at": utc(now),
    }


def recover(eng: Engine, snap: RuntimeSnapshot, now: float) -> None:
    """Load devices, unfinished tasks and open attempts into a fresh engine, then settle what a
    crash left unsettled: queued nodes whose device is gone, failures still awaiting a re-plan,
    agent nodes whose conversation died with the process."""
    from orchestrator.engine import llm_work

    for row in snap.devices:
        dev = device_from_row(row)
        if dev.liveness in (Liveness.ONLINE, Liveness.SUSPECT):
            # Nobody is known to be connected yet: take no new work until the device is heard
            # from, and give it a full heartbeat timeout before judging it lost (peers.md: restart
            # grace). The replica holding its socket reports it, or the agent says hello again.
            dev.liveness = Liveness.SUSPECT
            dev.recovering = True
            dev.heard_at = now
        eng.devices[dev.id] = dev
    for bundle in snap.tasks:
        if bundle.task.state == TaskState.PLANNING:
            eng.planning_to_resume.append((bundle.task.id, bundle.task.request or ""))
            continue
        run = task_from_bundle(bundle)
        llm_work.adopt(eng, run)
        eng.tasks[run.id] = run
        for a in bundle.attempts:
            if a.ended_at is None:
                eng.attempts[a.batch_id] = attempt_from_row(a)
        for node_id, rec in run.nodes.items():
            key = (run.id, node_id)
            if rec.state is NodeState.READY:
                eng.ready[key] = None
            elif rec.state is NodeState.QUEUED:
                holder = eng.devices.get(rec.queued_on or "")
                if holder is None:
                    eng._apply(run, run.unqueue(node_id), now)
                else:
                    holder.queue[key] = None
                    eng.queued_at[key] = holder.id
            if rec.state in (NodeState.READY, NodeState.QUEUED) and rec.ready_since:
                limit = rec.spec.queue_timeout_s or eng.settings.queue_timeout_s
                eng._timer(rec.ready_since + limit, "queue_timeout", (key, rec.ready_since))
            if rec.not_before:
                eng._timer(rec.not_before, "wake", None)
            if rec.state is NodeState.FAILED and run.hold_failures and _held_when_stored(run, node_id):
                run.held.add(node_id)  # its re-plan was under way: ask again
        # Successors of nodes that ended just before the crash may still be pending.
        eng._apply(run, run.start(now), now)
    for att in list(eng.attempts.values()):
        att.sent = True  # it may have reached the device before the crash
        if att.kind == "step" and att.parent in eng.attempts:
            eng.attempts[att.parent].step = att.batch_id
        elif att.deadline:
            eng._timer(att.deadline, "attempt_deadline", att.batch_id)
        if att.kind != "agent" and not att.accepted:
            eng._timer(now + eng.settings.batch_accept_timeout_s, "accept_deadline", att.batch_id)
    for att in [a for a in eng.attempts.values() if a.kind == "agent"]:
        llm_work.stop_agent(
            eng,
            att,
            ErrorCode.UNCERTAIN,
            "the orchestrator restarted while this agent node ran; "
            "its conversation was lost, and what it did on the device is uncertain",
            now,
            "restart",
        )


def _held_when_stored(run: TaskRun, node_id: str) -> bool:
    """Was this failed node held for a re-plan when the store was written? Its failure was not
    passed on: a successor still waits on it, or every node is done and the task is still
    running, which only a held failure prevents (its successors, if any, were decided by
    other edges)."""
    outgoing = run.graph.outgoing.get(node_id, [])
    if any(run.nodes[e.target].state is NodeState.PENDING for e in outgoing):
        return True
    return all(r.state.terminal for r in run.nodes.values())
