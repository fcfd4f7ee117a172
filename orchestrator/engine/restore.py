"""Rebuild engine records from store rows (start-up and recovery). Builds and returns them; what
they mean for the running engine (timers, queues, agents to stop) is the engine's to settle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.domain import fanout
from orchestrator.domain.model import AdminState, EdgeSpec, Liveness, NodeSpec, NodeState, TaskState
from orchestrator.domain.run import NodeRecord, TaskRun
from orchestrator.engine.controls import controls_of
from orchestrator.engine.records import AttemptKind, AttemptRun, DeviceRun
from orchestrator.store.models import Attempt, Device, Node, NodeChild
from orchestrator.store.repo import RuntimeSnapshot, TaskBundle
from protocol.messages import Command


def device_from_row(row: Device) -> DeviceRun:
    tools: dict[str, dict[str, Any]] = {t["name"]: t for t in (row.tools or []) if isinstance(t, dict)}
    dev = DeviceRun(
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
    dev.take_controls(controls_of(row))
    dev.applied_gen = int((row.control or {}).get("applied") or 0)
    dev.owner_takeover = (row.control or {}).get("owner_takeover")
    return dev


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
        _restore_record(run.nodes[n.id], n)
    _restore_rollouts(run, bundle)
    for a in bundle.attempts:
        unit = run.unit_of(a.node_id, a.device_id)
        if a.status == "failed" and a.kind not in ("step", "verify") and run.has(unit):
            rec = run.record(unit)
            rec.failed_on.add(a.device_id)
            if a.results and all(r.get("status") == "skipped" for r in a.results):
                rec.unstarted += 1  # the device turned it away unrun (see TaskRun.attempt_ended)
    run.recount()
    return run


def _restore_record(rec: NodeRecord, row: Node | NodeChild) -> None:
    rec.state = NodeState(row.state)
    rec.attempts = row.attempts
    rec.output = row.output
    rec.results = list(row.results or [])
    rec.error = row.error
    rec.ready_since = row.ready_since.timestamp() if row.ready_since else None
    rec.not_before = row.not_before.timestamp() if row.not_before else None
    rec.queued_on = row.queued_on


def _restore_rollouts(run: TaskRun, bundle: TaskBundle) -> None:
    """Fan-out nodes that have their children: the children's records, and the rollout
    releasing them as the children's states say."""
    rows: dict[str, list[NodeChild]] = {}
    for c in bundle.children:
        rows.setdefault(c.node_id, []).append(c)
    stored = {n.id: n.fan_out or {} for n in bundle.nodes}
    for node_id, children in rows.items():
        parent = run.nodes.get(node_id)
        if parent is None:
            continue
        children.sort(key=lambda c: c.position)
        found = [fanout.Target(c.device_id, c.device_name) for c in children]
        run.rollouts[node_id] = fanout.Rollout.of(parent.spec, found, list(stored[node_id].get("left_out") or []))
        for c in children:
            rec = NodeRecord(fanout.child_spec(parent.spec, c.device_id))
            _restore_record(rec, c)
            run.children[fanout.child_unit(node_id, c.device_id)] = rec


def verifications(bundle: TaskBundle) -> list[tuple[str, dict[str, Any] | None]]:
    """(unit, what its row keeps of its verification) of every node and child VERIFYING."""
    out: list[tuple[str, dict[str, Any] | None]] = [
        (n.id, n.verification) for n in bundle.nodes if n.state == NodeState.VERIFYING
    ]
    out += [
        (fanout.child_unit(c.node_id, c.device_id), c.verification)
        for c in bundle.children
        if c.state == NodeState.VERIFYING
    ]
    return out


def features_of(row: Device) -> frozenset[str]:
    """What its agent announced in its last hello (kept in `info`): only the engine reads it, for
    what it sends the device (a follower's copy of the fleet, for checks, does not need it)."""
    return frozenset((row.info or {}).get("features") or ())


def attempt_from_row(a: Attempt, fans_out: bool = False) -> AttemptRun:
    """`fans_out`: its node fans out, so the attempt is its child's on the attempt's device."""
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
        child=a.device_id if fans_out else None,
    )


@dataclass
class Recovered:
    """What the store holds of the runtime: devices, unfinished tasks with their open attempts,
    and the tasks whose planning was under way."""

    devices: list[DeviceRun] = field(default_factory=list)
    tasks: list[TaskRun] = field(default_factory=list)
    attempts: list[AttemptRun] = field(default_factory=list)
    planning: list[tuple[str, str]] = field(default_factory=list)  # (task id, request)
    verifying: list[tuple[str, str, dict[str, Any] | None]] = field(default_factory=list)  # (task, unit, row)


def load(snap: RuntimeSnapshot, now: float) -> Recovered:
    """Records of everything in `snap`. Devices that were connected are `recovering`: nobody is
    known to be connected yet, so they take no new work until heard from, and get a full
    heartbeat timeout before being judged lost (peers.md: restart grace)."""
    out = Recovered()
    for row in snap.devices:
        dev = device_from_row(row)
        dev.features = features_of(row)
        if dev.liveness in (Liveness.ONLINE, Liveness.SUSPECT):
            dev.liveness = Liveness.SUSPECT
            dev.recovering = True
            dev.heard_at = now
        out.devices.append(dev)
    for bundle in snap.tasks:
        if bundle.task.state == TaskState.PLANNING:
            out.planning.append((bundle.task.id, bundle.task.request or ""))
            continue
        run = task_from_bundle(bundle)
        out.tasks.append(run)
        out.attempts += [attempt_from_row(a, a.node_id in run.rollouts) for a in bundle.attempts if a.ended_at is None]
        out.verifying += [(run.id, unit, data) for unit, data in verifications(bundle)]
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
