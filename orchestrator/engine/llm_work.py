"""The engine's side of LLM work: planned tasks, agent-node attempts and their step batches, and
re-planning after a failure. The model calls themselves run outside the engine loop (in the
planner service); what they decide comes back as inputs and is applied here like any other change.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.domain import edits as edits_
from orchestrator.domain.model import DagSpec, NodeState, TaskState
from orchestrator.domain.problems import DomainError
from orchestrator.domain.run import AttemptOutcome, TaskRun
from orchestrator.engine.records import (
    AgentDone,
    AgentStep,
    AttemptRun,
    DeviceRun,
    NodeKey,
    PlanFailed,
    PlanReady,
    ReplanDone,
)
from orchestrator.engine.restore import attempt_row
from orchestrator.engine.times import batch_deadline, utc
from orchestrator.ids import new_id
from orchestrator.store.models import Attempt, DagEdit, Edge, Node, Task
from orchestrator.store.rows import node_rows

if TYPE_CHECKING:
    from orchestrator.engine.core import Engine


class PlannerHooks(Protocol):
    """What the engine asks of the planner service (all of it runs in background tasks)."""

    def start_agent(
        self, attempt_id: str, task_id: str, node_id: str, instruction: str, max_steps: int, device: dict[str, Any]
    ) -> None: ...

    def cancel_agent(self, attempt_id: str) -> None: ...

    def replan(self, task_id: str, node_id: str, context: dict[str, Any]) -> None: ...

    def start_planning(self, task_id: str, request: str) -> None: ...


def adopt(eng: Engine, run: TaskRun) -> None:
    """Decide whether a task's failures wait for the re-planner (SPEC section 6)."""
    run.hold_failures = (
        eng.planner is not None
        and (run.replan or run.request is not None)
        and run.replans_used < eng.settings.max_replans
    )


# ---------------------------------------------------------------- planned tasks


def on_plan_ready(eng: Engine, item: PlanReady, now: float) -> None:
    if item.task_id in eng.tasks:
        return
    run = TaskRun(item.task_id, list(item.spec.nodes), list(item.spec.edges))
    run.request = item.request
    run.replan = True
    adopt(eng, run)
    nodes, edge_rows = node_rows(item.task_id, item.spec)
    for row in nodes:
        eng._changes.insert(Node, row)
    for row in edge_rows:
        eng._changes.insert(Edge, row)
    values: dict[str, Any] = {"state": TaskState.RUNNING.value}
    if item.name:
        values["name"] = item.name[:200]
    eng._changes.update(Task, (item.task_id,), **values)
    eng._event("task.state", item.task_id, None, now, state=TaskState.RUNNING.value)
    eng._event(
        "dag.edited",
        item.task_id,
        None,
        now,
        version=1,
        added=[n.id for n in item.spec.nodes],
        removed=[],
        changed=[],
        reason="planned from the request",
        applied=True,
    )
    eng.tasks[item.task_id] = run
    eng._apply(run, run.start(now), now)


def on_plan_failed(eng: Engine, item: PlanFailed, now: float) -> None:
    error = {"code": item.code, "message": item.message}
    eng._changes.update(Task, (item.task_id,), state=TaskState.FAILED.value, error=error, finished_at=utc(now))
    eng._event("task.state", item.task_id, None, now, state=TaskState.FAILED.value, error=error)


# ---------------------------------------------------------------- agent nodes


def assign_agent(eng: Engine, dev: DeviceRun, key: NodeKey, now: float) -> None:
    """Give an agent node a device for the whole step loop: the device is held (busy) until the
    loop ends; each step is a batch of its own under this attempt's fence."""
    run = eng.tasks[key[0]]
    rec = run.nodes[key[1]]
    if eng.planner is None:
        eng._apply(
            run, run.fail(key[1], "planner_unavailable", "agent nodes need an LLM; none is configured", now), now
        )
        return
    att = eng._open_attempt(dev, key, [], now, kind="agent")
    device = {"id": dev.id, "name": dev.name, "platform": dev.platform, "tools": list(dev.tools.values())}
    eng._effects.append(
        functools.partial(
            eng.planner.start_agent,
            att.batch_id,
            att.task_id,
            att.node_id,
            rec.spec.instruction or "",
            rec.spec.max_steps,
            device,
        )
    )


def on_agent_step(eng: Engine, item: AgentStep, now: float) -> asyncio.Future[list[dict[str, Any]]]:
    parent = eng.attempts.get(item.attempt_id)
    waiter: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
    if parent is None or parent.kind != "agent":
        waiter.set_exception(asyncio.CancelledError("the agent attempt has ended"))
        return waiter
    dev = eng.devices[parent.device_id]
    commands = [
        {
            "call_id": f"c{i + 1}",
            "tool": c["tool"],
            "tool_type": dev.tools.get(c["tool"], {}).get("tool_type", "action"),
            "arguments": c["arguments"],
            "timeout_s": float(c.get("timeout_s", 60.0)),
        }
        for i, c in enumerate(item.commands)
    ]
    step = AttemptRun(
        new_id("b"),
        parent.task_id,
        parent.node_id,
        parent.n,
        dev.id,
        parent.fence,
        commands,
        parent.deadline or batch_deadline(now, None, commands),
        kind="step",
        parent=parent.batch_id,
        waiter=waiter,
        started=now,
    )
    parent.step = step.batch_id
    parent.tools_used += [c["tool"] for c in commands]
    eng.attempts[step.batch_id] = step
    eng._changes.insert(Attempt, attempt_row(step, now, "dispatched"))
    eng._timer(now + eng.settings.batch_accept_timeout_s, "accept_deadline", step.batch_id)
    eng._effects.append(lambda: eng._dispatch(step))
    return waiter


def end_step(
    eng: Engine, step: AttemptRun, outcome: AttemptOutcome, results: list[dict[str, Any]] | None, now: float
) -> None:
    """A step batch ended: record it and hand its results to the waiting agent loop."""
    eng.attempts.pop(step.batch_id, None)
    parent = eng.attempts.get(step.parent or "")
    if parent is not None and parent.step == step.batch_id:
        parent.step = None
    shown = (
        results
        if results is not None
        else [
            {
                "call_id": c["call_id"],
                "status": "failure",
                "error": {"code": outcome.error_code, "message": outcome.error_message},
            }
            for c in step.commands
        ]
    )
    eng._changes.update(
        Attempt,
        (step.batch_id,),
        status="succeeded" if outcome.succeeded else "failed",
        ended_at=utc(now),
        results=results,
        error=None if outcome.succeeded else {"code": outcome.error_code, "message": outcome.error_message},
    )
    if step.waiter is not None and not step.waiter.done():
        step.waiter.set_result(shown)


def on_agent_done(eng: Engine, item: AgentDone, now: float) -> None:
    att = eng.attempts.get(item.attempt_id)
    if att is None or att.kind != "agent":
        return
    dev = eng.devices.get(att.device_id)
    if dev is not None and dev.current_batch == att.batch_id:
        eng._set_current(dev, att.step)  # a step still out frees the device when it reports
    hints = tuple(dev.hints(t) for t in att.tools_used) if dev else ()
    outcome = AttemptOutcome(
        item.succeeded,
        output=item.output,
        error_code=item.error_code,
        error_message=item.error_message,
        started=bool(att.tools_used),
        tool_hints=hints,
        tools=tuple(att.tools_used) if dev else (),
        cancelled=att.cancel_reason == "cancelled",
    )
    eng._end_attempt(att, outcome, now)


def stop_agent(eng: Engine, att: AttemptRun, code: str, message: str, now: float, reason: str) -> None:
    """End an agent attempt from the engine's side (cancel, timeout, device lost, restart)."""
    if eng.planner is not None:
        eng.planner.cancel_agent(att.batch_id)
    step = eng.attempts.get(att.step or "")
    if step is not None:
        eng._send_cancel(step, reason)
    att.cancel_reason = reason
    on_agent_done(eng, AgentDone(att.batch_id, False, error_code=code, error_message=message, tools_used=[]), now)


# ---------------------------------------------------------------- re-planning


def maybe_replan(eng: Engine, run: TaskRun, now: float) -> None:
    """Ask the planner about each newly held failure, or let it go when no re-plan can happen."""
    for node_id in sorted(run.held - run.replanning):
        if eng.planner is None or run.replans_used >= eng.settings.max_replans or run.cancel_requested:
            eng._apply(run, run.release(node_id, now), now)
            continue
        run.replanning.add(node_id)
        context = replan_context(eng, run, node_id)
        eng._effects.append(functools.partial(eng.planner.replan, run.id, node_id, context))


def replan_context(eng: Engine, run: TaskRun, failed: str) -> dict[str, Any]:
    return {
        "request": run.request,
        "version": run.version,
        "failed": failed,
        "nodes": [
            {
                "id": nid,
                "state": r.state.value,
                "error": r.error,
                "spec": r.spec.model_dump(mode="json", exclude_defaults=True),
            }
            for nid, r in run.nodes.items()
        ],
        "edges": run.edges,
        "inventory_devices": eng.inventory(),
    }


def on_replan_done(eng: Engine, item: ReplanDone, now: float) -> None:
    run = eng.tasks.get(item.task_id)
    if run is None or item.node_id not in run.replanning:
        return
    run.replanning.discard(item.node_id)
    run.replans_used += 1
    adopt(eng, run)
    if item.edits is not None and item.edits.edits and not run.cancel_requested:
        _apply_edits(eng, run, item, now)
    elif item.error:
        _edit_refused(eng, run, now, item.error, [])
    eng._changes.update(Task, (run.id,), replans_used=run.replans_used)
    eng._apply(run, run.release(item.node_id, now), now)


def _apply_edits(eng: Engine, run: TaskRun, item: ReplanDone, now: float) -> None:
    assert item.edits is not None
    old_nodes = {n.id for n in run.specs()}
    old_edges = {(e.source, e.target): e.on for e in run.edges}
    try:
        result = edits_.apply(
            run.specs(), run.edges, run.states(), list(item.edits.edits), eng.known_tools(), eng.settings.dag_limits
        )
    except DomainError as exc:
        _edit_refused(eng, run, now, item.edits.reason, [p.as_dict() for p in exc.problems])
        return
    run.replace_graph(result.nodes, result.edges)
    run.version += 1
    added_nodes, added_edges = node_rows(run.id, _spec_of(result), start=len(old_nodes))
    for row in added_nodes:
        if row["id"] in result.added:
            eng._changes.insert(Node, row)
    for node_id in result.changed:
        eng._changes.update(Node, (run.id, node_id), spec=run.nodes[node_id].spec.model_dump(mode="json"))
    for node_id in result.removed:
        eng._changes.delete(Node, (run.id, node_id))
        eng.ready.pop((run.id, node_id), None)
    new_edges = {(e.source, e.target): e.on for e in result.edges}
    for src, dst in old_edges.keys() - new_edges.keys():
        eng._changes.delete(Edge, (run.id, src, dst))
    for row in added_edges:
        pair = (row["source"], row["target"])
        if pair not in old_edges:
            eng._changes.insert(Edge, row)
        elif old_edges[pair] != new_edges[pair]:  # the same pair with another `on` (remove + add)
            eng._changes.update(Edge, (run.id, *pair), on=new_edges[pair].value)
    eng._changes.update(Task, (run.id,), dag_version=run.version)
    edit_log = [e.model_dump(mode="json", by_alias=True) for e in item.edits.edits]
    eng._changes.insert(
        DagEdit,
        {"task_id": run.id, "version": run.version, "reason": item.edits.reason, "edits": edit_log, "at": utc(now)},
    )
    eng._event(
        "dag.edited",
        run.id,
        None,
        now,
        version=run.version,
        applied=True,
        reason=item.edits.reason,
        added=result.added,
        removed=result.removed,
        changed=result.changed,
    )
    for node_id in result.added:
        if run.nodes[node_id].state is NodeState.PENDING:
            eng._event("node.state", run.id, node_id, now, state=NodeState.PENDING.value)
    eng._apply(run, run.start(now), now)  # new nodes whose edges are already decided become ready


def _edit_refused(eng: Engine, run: TaskRun, now: float, reason: str, problems: list[dict[str, Any]]) -> None:
    """The graph stays as it was; the event says why, for the dashboard and the CLI."""
    eng._event("dag.edited", run.id, None, now, version=run.version, applied=False, reason=reason, problems=problems)


def _spec_of(result: edits_.EditResult) -> DagSpec:
    return DagSpec(nodes=result.nodes, edges=result.edges)
