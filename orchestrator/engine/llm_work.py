"""The engine's side of LLM work: planned tasks, agent-node attempts and their step batches, and
re-planning after a failure. The model calls themselves run outside the engine loop (in the
planner service); what they decide comes back as inputs and is applied here like any other change.

`LlmWork` is handed the collaborators it changes (the step writer, the open attempts, the fleet,
the queues, the outbox, the timers) and one callback, `apply`, that records task transitions the way every
other change is recorded. How an agent attempt ended it returns, for the engine to end."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Protocol

from orchestrator.config import Settings
from orchestrator.domain import edits as edits_
from orchestrator.domain.model import DagSpec, NodeSpec, NodeState, TaskState
from orchestrator.domain.problems import DomainError
from orchestrator.domain.run import AttemptOutcome, TaskRun, Transition
from orchestrator.engine.attempts import Attempts, agent_outcome, attempt_row, ended_row
from orchestrator.engine.fleet import Fleet
from orchestrator.engine.outbox import Outbox
from orchestrator.engine.queues import Queues
from orchestrator.engine.records import (
    AgentDone,
    AgentStep,
    AttemptKind,
    AttemptRun,
    DeviceRun,
    PlanFailed,
    PlanReady,
    ReplanDone,
)
from orchestrator.engine.takeovers import Takeovers
from orchestrator.engine.timers import AcceptDeadline, Timers
from orchestrator.engine.times import batch_deadline, utc
from orchestrator.engine.writer import EventType, StepWriter
from orchestrator.store.models import Attempt, DagEdit, Edge, Node, Task
from orchestrator.store.rows import node_rows
from protocol.messages import Command

Apply = Callable[[TaskRun, list[Transition], float], None]


class PlannerHooks(Protocol):
    """What the engine asks of the planner service (all of it runs in background tasks)."""

    def start_agent(
        self, attempt_id: str, task_id: str, node_id: str, instruction: str, max_steps: int, device: dict[str, Any]
    ) -> None: ...

    def cancel_agent(self, attempt_id: str) -> None: ...

    def replan(self, task_id: str, node_id: str, context: dict[str, Any]) -> None: ...

    def start_planning(self, task_id: str, request: str) -> None: ...


class LlmWork:
    def __init__(
        self,
        settings: Settings,
        tasks: dict[str, TaskRun],
        writer: StepWriter,
        attempts: Attempts,
        fleet: Fleet,
        queues: Queues,
        outbox: Outbox,
        timers: Timers,
        apply: Apply,
    ) -> None:
        self.settings = settings
        self.tasks = tasks
        self.writer = writer
        self.attempts = attempts
        self.fleet = fleet
        self.queues = queues
        self.outbox = outbox
        self.timers = timers
        self.apply = apply
        self.planner: PlannerHooks | None = None
        self.takeovers: Takeovers | None = None
        self.planning: set[str] = set()  # tasks whose plan the planner is working on

    def adopt(self, run: TaskRun) -> None:
        """Decide whether a task's failures wait for the re-planner (SPEC section 6)."""
        run.hold_failures = (
            self.planner is not None
            and (run.replan or run.request is not None)
            and run.replans_used < self.settings.max_replans
        )

    # ---------------------------------------------------------------- planned tasks

    def start_planning(self, task_id: str, request: str) -> None:
        if self.planner is not None and task_id not in self.planning:
            self.planning.add(task_id)
            self.planner.start_planning(task_id, request)

    def plan_ready(self, item: PlanReady, now: float) -> None:
        self.planning.discard(item.task_id)
        if item.task_id in self.tasks:
            return
        run = TaskRun(item.task_id, list(item.spec.nodes), list(item.spec.edges))
        run.request = item.request
        run.replan = True
        self.adopt(run)
        nodes, edge_rows = node_rows(item.task_id, item.spec)
        for row in nodes:
            self.writer.insert(Node, row)
        for row in edge_rows:
            self.writer.insert(Edge, row)
        values: dict[str, Any] = {"state": TaskState.RUNNING.value}
        if item.name:
            values["name"] = item.name[:200]
        self.writer.update(Task, (item.task_id,), **values)
        self.writer.event(EventType.TASK_STATE, item.task_id, None, now, state=TaskState.RUNNING.value)
        self.writer.event(
            EventType.DAG_EDITED,
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
        self.tasks[item.task_id] = run
        self.apply(run, run.start(now), now)

    def plan_failed(self, item: PlanFailed, now: float) -> None:
        self.planning.discard(item.task_id)
        error = {"code": item.code, "message": item.message}
        self.writer.update(Task, (item.task_id,), state=TaskState.FAILED.value, error=error, finished_at=utc(now))
        self.writer.event(EventType.TASK_STATE, item.task_id, None, now, state=TaskState.FAILED.value, error=error)

    # ---------------------------------------------------------------- agent nodes

    def start_agent(self, att: AttemptRun, dev: DeviceRun, spec: NodeSpec) -> None:
        """An agent attempt holds `dev` for its whole step loop (the device is busy until the
        loop ends); each step is a batch of its own under this attempt's fence."""
        planner = self.planner
        assert planner is not None, "agent attempts open only with a planner"
        device = {"id": dev.id, "name": dev.name, "platform": dev.platform, "tools": list(dev.tools.values())}
        instruction, max_steps = spec.instruction or "", spec.max_steps
        self.writer.effect(
            lambda: planner.start_agent(att.batch_id, att.task_id, att.node_id, instruction, max_steps, device)
        )

    def agent_step(self, item: AgentStep, now: float) -> asyncio.Future[list[dict[str, Any]]]:
        parent = self.attempts.get(item.attempt_id)
        waiter: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        if parent is None or parent.kind is not AttemptKind.AGENT:
            waiter.set_exception(asyncio.CancelledError("the agent attempt has ended"))
            return waiter
        dev = self.fleet.devices[parent.device_id]
        if self.takeovers is not None and self.takeovers.step(parent, dev, item, waiter, now):
            return waiter  # its device is taken over, or was handed back since its last step
        commands = [
            Command(
                call_id=f"c{i + 1}",
                tool=c.tool,
                tool_type=dev.tools.get(c.tool, {}).get("tool_type", "action"),
                arguments=c.arguments,
                timeout_s=c.timeout_s,
            )
            for i, c in enumerate(item.commands)
        ]
        step = AttemptRun(
            self.attempts.new_batch_id(),
            parent.task_id,
            parent.node_id,
            parent.n,
            dev.id,
            parent.fence,
            commands,
            parent.deadline or batch_deadline(now, None, commands),
            started=now,
            kind=AttemptKind.STEP,
            parent=parent.batch_id,
            waiter=waiter,
            child=parent.child,
            record=parent.record,
        )
        parent.step = step.batch_id
        parent.tools_used += [c.tool for c in commands]
        self.attempts.add(step)
        self.writer.insert(Attempt, attempt_row(step, now, "dispatched"))
        self.timers.add(now + self.settings.batch_accept_timeout_s, AcceptDeadline(step.batch_id))
        self.outbox.dispatch_after_commit(step)
        return waiter

    def end_step(
        self, step: AttemptRun, outcome: AttemptOutcome, results: list[dict[str, Any]] | None, now: float
    ) -> None:
        """A step batch ended: record it and hand its results to the waiting agent loop."""
        self.attempts.drop(step)
        parent = self.attempts.get(step.parent)
        if parent is not None and parent.step == step.batch_id:
            parent.step = None
        shown = (
            results
            if results is not None
            else [
                {
                    "call_id": c.call_id,
                    "status": "failure",
                    "error": {"code": outcome.error_code, "message": outcome.error_message},
                }
                for c in step.commands
            ]
        )
        self.writer.update(Attempt, (step.batch_id,), **ended_row(outcome, now, results))
        if step.waiter is not None and not step.waiter.done():
            step.waiter.set_result(shown)

    def agent_done(self, item: AgentDone, now: float) -> tuple[AttemptRun, AttemptOutcome] | None:
        """The agent loop finished: the attempt and how it ended, for the engine to end it."""
        att = self.attempts.get(item.attempt_id)
        if att is None or att.kind is not AttemptKind.AGENT:
            return None
        dev = self.fleet.devices.get(att.device_id)
        if dev is not None and dev.current_batch == att.batch_id:
            self.fleet.set_current(dev, att.step, now)  # a step still out frees the device when it reports
        hints = dev.hints if dev is not None else None
        return att, agent_outcome(att, hints, item.succeeded, item.output, item.error_code, item.error_message)

    def stop_agent(
        self, att: AttemptRun, code: str, message: str, now: float, reason: str
    ) -> tuple[AttemptRun, AttemptOutcome] | None:
        """End an agent attempt from the engine's side (cancel, timeout, device lost, restart)."""
        if self.planner is not None:
            self.planner.cancel_agent(att.batch_id)
        step = self.attempts.get(att.step)
        if step is not None:
            self.outbox.cancel(step, reason)
        att.cancel_reason = reason
        return self.agent_done(AgentDone(att.batch_id, False, error_code=code, error_message=message), now)

    def agent_ended(self, att: AttemptRun) -> None:
        if self.planner is not None:
            self.planner.cancel_agent(att.batch_id)

    # ---------------------------------------------------------------- re-planning

    def replan_held(self, run: TaskRun, now: float) -> None:
        """Ask the planner about each newly held failure, or let it go when no re-plan can happen."""
        planner = self.planner
        for node_id in sorted(run.held - run.replanning):
            if planner is None or run.replans_used >= self.settings.max_replans or run.cancel_requested:
                self.apply(run, run.release(node_id, now), now)
                continue
            run.replanning.add(node_id)
            context = replan_context(run, node_id, self.fleet.inventory())
            self.writer.effect(functools.partial(planner.replan, run.id, node_id, context))

    def replan_done(self, item: ReplanDone, now: float) -> None:
        run = self.tasks.get(item.task_id)
        if run is None or item.node_id not in run.replanning:
            return
        run.replans_used += 1
        self.adopt(run)
        # The node stays "being re-planned" while the edits go in: applying them must not ask the
        # planner about this same failure again (found by the simulator, tests/sim).
        if item.edits is not None and item.edits.edits and not run.cancel_requested:
            self._apply_edits(run, item, now)
        elif item.error:
            self._edit_refused(run, now, item.error, [])
        run.replanning.discard(item.node_id)
        self.writer.update(Task, (run.id,), replans_used=run.replans_used)
        self.apply(run, run.release(item.node_id, now), now)
        if not run.hold_failures:
            # The task's re-plans are spent: failures still waiting for an answer take their course
            # now, as a restart from the store would decide (it cannot know what was asked).
            for other in sorted(run.replanning):
                run.replanning.discard(other)
                self.apply(run, run.release(other, now), now)

    def _apply_edits(self, run: TaskRun, item: ReplanDone, now: float) -> None:
        assert item.edits is not None
        w = self.writer
        old_nodes = {n.id for n in run.specs()}
        old_edges = {(e.source, e.target): e.on for e in run.edges}
        try:
            result = edits_.apply(
                run.specs(),
                run.edges,
                run.states(),
                list(item.edits.edits),
                self.fleet.known_tools(),
                self.settings.dag_limits,
            )
        except DomainError as exc:
            self._edit_refused(run, now, item.edits.reason, [p.as_dict() for p in exc.problems])
            return
        run.replace_graph(result.nodes, result.edges)
        run.version += 1
        added_nodes, added_edges = node_rows(run.id, _spec_of(result), start=len(old_nodes))
        for row in added_nodes:
            if row["id"] in result.added:
                w.insert(Node, row)
        for node_id in result.changed:
            w.update(Node, (run.id, node_id), spec=run.nodes[node_id].spec.model_dump(mode="json"))
        for node_id in result.removed:
            w.delete(Node, (run.id, node_id))
            self.queues.not_ready((run.id, node_id))
        new_edges = {(e.source, e.target): e.on for e in result.edges}
        for src, dst in old_edges.keys() - new_edges.keys():
            w.delete(Edge, (run.id, src, dst))
        for row in added_edges:
            pair = (row["source"], row["target"])
            if pair not in old_edges:
                w.insert(Edge, row)
            elif old_edges[pair] != new_edges[pair]:  # the same pair with another `on` (remove + add)
                w.update(Edge, (run.id, *pair), on=new_edges[pair].value)
        w.update(Task, (run.id,), dag_version=run.version)
        edit_log = [e.model_dump(mode="json", by_alias=True) for e in item.edits.edits]
        w.insert(
            DagEdit,
            {"task_id": run.id, "version": run.version, "reason": item.edits.reason, "edits": edit_log, "at": utc(now)},
        )
        w.event(
            EventType.DAG_EDITED,
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
                w.event(EventType.NODE_STATE, run.id, node_id, now, state=NodeState.PENDING.value)
        self.apply(run, run.start(now), now)  # new nodes whose edges are already decided become ready

    def _edit_refused(self, run: TaskRun, now: float, reason: str, problems: list[dict[str, Any]]) -> None:
        """The graph stays as it was; the event says why, for the dashboard and the CLI."""
        self.writer.event(
            EventType.DAG_EDITED,
            run.id,
            None,
            now,
            version=run.version,
            applied=False,
            reason=reason,
            problems=problems,
        )


def replan_context(run: TaskRun, failed: str, inventory: list[dict[str, Any]]) -> dict[str, Any]:
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
        "inventory_devices": inventory,
    }


def _spec_of(result: edits_.EditResult) -> DagSpec:
    return DagSpec(nodes=result.nodes, edges=result.edges)
