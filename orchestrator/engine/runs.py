"""The tasks being run: their transitions recorded (node rows, events, the ready set and queue
timers kept true), attempts opened on devices and ended however they end, placement decisions and
fleet actions carried out, and timers fired. One step of the engine calls into this; it is
handed its collaborators, never the engine."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from orchestrator.config import Settings
from orchestrator.domain import fanout, recording, templates
from orchestrator.domain.checks import schema_errors
from orchestrator.domain.model import TERMINAL_NODE_STATES, CommandSpec, Liveness, NodeKind, NodeState
from orchestrator.domain.problems import Problem
from orchestrator.domain.run import AttemptOutcome, NodeTransition, TaskRun, TaskTransition, Transition
from orchestrator.engine.actions import Action, Lost, Requeue, Revoked, Stopped, Takeover
from orchestrator.engine.attempts import Attempts, attempt_row, ended_row, unanswered
from orchestrator.engine.fanouts import FanOuts
from orchestrator.engine.fleet import Fleet
from orchestrator.engine.llm_work import LlmWork
from orchestrator.engine.outbox import Outbox
from orchestrator.engine.queues import Assign, Enqueue, NeverRunnable, Queues
from orchestrator.engine.records import AttemptKind, AttemptRun, DeviceRun, NodeKey
from orchestrator.engine.timers import (
    AcceptDeadline,
    ApprovalExpiry,
    AttemptDeadline,
    ProbeTimeout,
    QueueTimeout,
    Sweep,
    Timers,
    Wake,
)
from orchestrator.engine.times import BATCH_GRACE_S, batch_deadline, utc
from orchestrator.engine.verification import Verifications
from orchestrator.engine.writer import EventType, StepWriter
from orchestrator.metrics import Metrics
from orchestrator.store.models import Attempt, Task
from protocol.errors import ErrorCode
from protocol.messages import Command, RecordingEnd

log = logging.getLogger("orrery.engine")


class Runs:
    def __init__(
        self,
        settings: Settings,
        tasks: dict[str, TaskRun],
        writer: StepWriter,
        timers: Timers,
        queues: Queues,
        attempts: Attempts,
        fleet: Fleet,
        outbox: Outbox,
        llm: LlmWork,
        metrics: Metrics,
        rng: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.tasks = tasks
        self.writer = writer
        self.timers = timers
        self.queues = queues
        self.attempts = attempts
        self.fleet = fleet
        self.outbox = outbox
        self.llm = llm
        self.metrics = metrics
        self.rng = rng
        self._transitions: dict[NodeState, Any] = {}  # the transitions counter's child per state
        self._batches: dict[str, Any] = {}  # the batches counter's child per outcome
        self.fanouts = FanOuts(fleet, writer)  # fan-out children
        self.verify = Verifications(settings, tasks, writer, timers, queues, attempts, fleet, outbox, self.apply, rng)
        # Set by the engine: approvals hear of expiries and of attempts that end.
        self.on_approval_expiry: Callable[[ApprovalExpiry, float], None] = lambda timer, now: None
        self.on_attempt_end: Callable[[AttemptRun, float], None] = lambda att, now: None
        self.on_takeover: Callable[[DeviceRun, bool, str, str, float], None] = lambda dev, taken, by, note, now: None

    def cancel(self, task_id: str, now: float) -> bool:
        """Cancel a task: its running batches are told to stop, its agent loops end."""
        run = self.tasks.get(task_id)
        if run is None or run.terminal:
            return False
        for att in self.attempts.of_task(task_id):
            if att.kind is AttemptKind.AGENT:
                self.end_agent(
                    self.llm.stop_agent(att, ErrorCode.CANCELLED, "the task was cancelled", now, "cancelled"), now
                )
            elif att.kind in (AttemptKind.TOOL, AttemptKind.VERIFY):
                self.outbox.cancel(att, "cancelled")
        self.writer.update(Task, (task_id,), cancel_requested=True)
        self.apply(run, run.cancel(now), now)
        self.verify.cancel(run, now)  # nodes waiting for a device to verify them
        return True

    def carry_out(self, actions: list[Action], now: float) -> None:
        """Apply what the fleet decided for tasks."""
        for action in actions:
            if isinstance(action, Requeue):
                for key in action.keys:
                    run = self.tasks[key[0]]
                    self.apply(run, run.unqueue(key[1]), now)
            elif isinstance(action, Lost):
                self._lose_attempts(action.device, action.message, now)
            elif isinstance(action, Stopped):
                for att in self.attempts.on_device(action.device.id):
                    if att.kind is AttemptKind.AGENT:
                        ended = self.llm.stop_agent(
                            att, ErrorCode.DEVICE_STOPPED, action.message, now, "device_stopped"
                        )
                        self.end_agent(ended, now)
            elif isinstance(action, Revoked):
                for key in list(self.queues.ready):
                    self._fail_if_never_runnable(key, now)
            elif isinstance(action, Takeover):
                self.on_takeover(action.device, action.taken, action.by, action.note, now)

    def _lose_attempts(self, dev: DeviceRun, message: str, now: float) -> None:
        steps_first = sorted(self.attempts.on_device(dev.id), key=lambda a: a.kind is not AttemptKind.STEP)
        for att in steps_first:
            if att.kind is AttemptKind.AGENT:
                self.end_agent(self.llm.stop_agent(att, ErrorCode.DEVICE_LOST, message, now, "device_lost"), now)
            elif self.attempts.get(att.batch_id) is not None:
                self.end_attempt(att, unanswered(att, dev, ErrorCode.DEVICE_LOST, message), now)
        self.fleet.set_current(dev, None, now)

    def _end_recording(self, att: AttemptRun, outcome: AttemptOutcome) -> None:
        """Tell its device whether the attempt's screen recording is kept (uploaded as its
        artifact) or deleted. Best effort: a device that never hears deletes it within the hour."""
        kept = recording.keep("always" if att.record == "always" else "failures", outcome.succeeded)
        how = "succeeded" if outcome.succeeded else (outcome.error_code or "failed")
        frame = RecordingEnd(task_id=att.task_id, node_id=att.node_id, attempt=att.n, keep=kept, outcome=how[:64])
        dev = self.fleet.devices.get(att.device_id)
        if dev is not None:
            self.outbox.frame_after_commit(dev, frame)

    def _open_attempt(
        self, dev: DeviceRun, key: NodeKey, commands: list[Command], now: float, kind: AttemptKind
    ) -> AttemptRun:
        """A new attempt of `key` on `dev`: next fence, device held, attempt stored, node running."""
        run = self.tasks[key[0]]
        rec = run.record(key[1])
        fence = self.fleet.next_fence(dev)
        agent = kind is AttemptKind.AGENT
        node_id, child = fanout.split_unit(key[1])
        att = AttemptRun(
            self.attempts.new_batch_id(),
            key[0],
            node_id,
            rec.attempts + 1,
            dev.id,
            fence,
            commands,
            batch_deadline(now, rec.spec.timeout_s, commands),
            started=now,
            kind=kind,
            sent=agent,
            child=child,
            record=recording.mode(rec.spec, dev.features),
        )
        self.attempts.add(att)
        self.fleet.set_current(dev, att.batch_id, now)
        self.writer.insert(Attempt, attempt_row(att, now, "running" if agent else "dispatched"))
        self.apply(run, run.mark_running(key[1]), now)
        if att.n == 1:
            self.writer.update(*self.fanouts.row(run, key[1]), started_at=utc(now))
        if rec.ready_since:
            self.metrics.schedule_to_start.observe(max(0.0, now - rec.ready_since))
        if log.isEnabledFor(logging.DEBUG):  # every dispatch passes here: no record's fields made for nothing
            ids = {"task_id": att.task_id, "node_id": att.node_id, "batch_id": att.batch_id, "device_id": dev.id}
            log.debug("batch dispatched", extra=ids)
        self.writer.event(
            EventType.NODE_ATTEMPT,
            att.task_id,
            att.node_id,
            now,
            state="dispatched",
            attempt=att.n,
            batch_id=att.batch_id,
            device_id=dev.id,
        )
        if att.deadline:
            self.timers.add(att.deadline, AttemptDeadline(att.batch_id))
        return att

    def _assign(self, dev: DeviceRun, key: NodeKey, now: float) -> None:
        run = self.tasks[key[0]]
        rec = run.record(key[1])
        if rec.spec.kind is NodeKind.AGENT:
            if self.llm.planner is None:
                message = "agent nodes need an LLM; none is configured"
                self.apply(run, run.fail(key[1], "planner_unavailable", message, now), now)
                return
            att = self._open_attempt(dev, key, [], now, AttemptKind.AGENT)
            self.llm.start_agent(att, dev, rec.spec)
            return
        try:
            commands = [
                Command(
                    call_id=f"c{i + 1}",
                    tool=c.tool,
                    tool_type=dev.tools.get(c.tool, {}).get("tool_type", "action"),
                    arguments=templates.resolve(c.arguments, run.outcome_of),
                    timeout_s=c.timeout_s,
                )
                for i, c in enumerate(rec.spec.commands)
            ]
        except templates.TemplateError as exc:
            self.apply(run, run.fail(key[1], ErrorCode.TEMPLATE_ERROR, str(exc), now), now)
            return
        misfit = _misfit(rec.spec.commands, commands, dev)
        if misfit is not None:
            self.apply(run, run.fail(key[1], ErrorCode.INVALID_ARGUMENTS, misfit, now), now)
            return
        att = self._open_attempt(dev, key, commands, now, AttemptKind.TOOL)
        self.timers.add(now + self.settings.batch_accept_timeout_s, AcceptDeadline(att.batch_id))
        self.outbox.dispatch_after_commit(att)

    def end_agent(self, ended: tuple[AttemptRun, AttemptOutcome] | None, now: float) -> None:
        if ended is not None:
            self.end_attempt(ended[0], ended[1], now)

    def end_attempt(
        self, att: AttemptRun, outcome: AttemptOutcome, now: float, results: list[Any] | None = None
    ) -> None:
        self.on_attempt_end(att, now)  # its approvals not decided yet are asked to be cancelled
        if att.record != "off" and att.kind in (AttemptKind.TOOL, AttemptKind.AGENT):
            self._end_recording(att, outcome)
        if att.refused is not None and not outcome.succeeded and outcome.error_code != att.refused:
            # A person refused a command of it: however it ended, it ends refused (never retried).
            why = f"{outcome.error_message} (a command of it was refused: {att.refused})"
            outcome = dataclasses.replace(outcome, error_code=att.refused, error_message=why)
        dev = self.fleet.devices.get(att.device_id)
        if dev is not None and dev.current_batch == att.batch_id:
            # The engine is done with this batch, however it ended (results, a timeout, a refusal,
            # the device lost): the device takes work again. If it is in fact still finishing
            # it, its agent queues the next batch behind it (one batch at a time, SPEC section 5).
            self.fleet.set_current(dev, None, now)
        dumped = outcome.results if results is not None else None  # dumped once, by `outcome`
        if att.kind is AttemptKind.STEP:
            self.llm.end_step(att, outcome, dumped, now)
            return
        if att.kind is AttemptKind.AGENT:
            self.llm.agent_ended(att)
        self.attempts.close(att, results is not None)
        self._batch_counter("succeeded" if outcome.succeeded else outcome.error_code or "failed").inc()
        self.metrics.command_roundtrip.observe(max(0.0, now - att.started))
        if not outcome.succeeded:
            ids = {"task_id": att.task_id, "node_id": att.node_id, "batch_id": att.batch_id, "device_id": att.device_id}
            log.info("attempt failed: %s", outcome.error_code, extra=ids)
        row = ended_row(outcome, now, dumped)
        if results is not None and not att.accepted:
            # Results are the device's acceptance too: an agent whose batch finishes quickly
            # sends them instead of a `batch_accepted` of its own (device_agent.agent.ACCEPT_AFTER_S).
            att.accepted = True
            row["accepted_at"] = utc(now)
        self.writer.merge(Attempt, (att.batch_id,), row)
        self.writer.event(
            EventType.NODE_ATTEMPT,
            att.task_id,
            att.node_id,
            now,
            state=row["status"],
            attempt=att.n,
            batch_id=att.batch_id,
            device_id=att.device_id,
            error=row["error"],
        )
        run = self.tasks.get(att.task_id)
        unit = att.key[1]
        if run is None or not run.has(unit):
            return
        if att.kind is AttemptKind.VERIFY:
            self.verify.ended(run, att, outcome, now)
            return
        if not outcome.succeeded:
            run.record(unit).failed_on.add(att.device_id)
        if self.verify.wants(run, unit, outcome):
            self.verify.begin(run, att, outcome, now)  # its verify commands decide
            return
        self.apply(run, run.attempt_ended(unit, outcome, now, self.rng()), now)

    def _batch_counter(self, outcome: str) -> Any:
        counter = self._batches.get(outcome)
        if counter is None:  # a child per outcome, looked up once (every batch ends here)
            counter = self._batches[outcome] = self.metrics.batches.labels(outcome)
        return counter

    def _timeout_attempt(self, att: AttemptRun, message: str, now: float) -> None:
        self.outbox.cancel(att, "timeout")
        self.end_attempt(att, unanswered(att, self.fleet.devices.get(att.device_id), ErrorCode.TIMEOUT, message), now)

    def schedule(self, now: float) -> None:
        self.verify.dispatch(now)  # before placement: a device back in service verifies first
        for decision in self.queues.placements(now):
            run = self.tasks[decision.key[0]]
            if isinstance(decision, Assign):
                self._assign(decision.device, decision.key, now)
            elif isinstance(decision, Enqueue):
                self.apply(run, run.mark_queued(decision.key[1], decision.device.id), now)
            elif isinstance(decision, NeverRunnable):
                self._fail_never_runnable(run, decision.key, decision.problem, now)

    def _fail_if_never_runnable(self, key: NodeKey, now: float) -> None:
        run = self.tasks[key[0]]
        problem = self.queues.never_runnable(run.record(key[1]).spec)
        if problem is not None:
            self._fail_never_runnable(run, key, problem, now)

    def _fail_never_runnable(self, run: TaskRun, key: NodeKey, problem: Problem, now: float) -> None:
        self.apply(run, run.fail(key[1], ErrorCode.NO_CAPABLE_DEVICE, problem.message, now), now)

    def fire_timers(self, now: float) -> None:
        for _when, timer in self.timers.due(now):
            if isinstance(timer, QueueTimeout):
                self._queue_timeout(timer, now)
            elif isinstance(timer, AttemptDeadline):
                att = self.attempts.get(timer.batch_id)
                paused = att is not None and (att.waiting_since is not None or att.paused_since is not None)
                if att is not None and (paused or (att.deadline or now) > now):
                    pass  # waiting for a person (an approval, a takeover), or its deadline moved on (a later timer)
                elif att is not None and att.kind is AttemptKind.AGENT:
                    message = (
                        "the agent node did not finish within its timeout_s; "
                        "raise timeout_s or simplify the instruction"
                    )
                    self.end_agent(self.llm.stop_agent(att, ErrorCode.TIMEOUT, message, now, "timeout"), now)
                elif att is not None:
                    self._timeout_attempt(att, self._deadline_message(att), now)
            elif isinstance(timer, AcceptDeadline):
                att = self.attempts.get(timer.batch_id)
                if att is not None and not att.accepted:
                    dev = self.fleet.devices.get(att.device_id)
                    if dev is not None and dev.liveness is Liveness.ONLINE:
                        limit = self.settings.batch_accept_timeout_s
                        self._timeout_attempt(att, f"the device did not accept the batch within {limit:g}s", now)
            elif isinstance(timer, ApprovalExpiry):
                self.on_approval_expiry(timer, now)
            elif isinstance(timer, ProbeTimeout):
                self.verify.timeout(timer, now)
            elif isinstance(timer, Sweep):
                self.carry_out(self.fleet.sweep(now), now)
                self.timers.add(now + self.settings.link_report_interval_s, Sweep())
            # `Wake` timers only make the loop run a scheduling pass

    def _deadline_message(self, att: AttemptRun) -> str:
        run = self.tasks.get(att.task_id)
        rec = run.nodes.get(att.node_id) if run else None
        if rec is not None and rec.spec.timeout_s:
            limit = f"the node's timeout_s ({rec.spec.timeout_s:g}s)"
        else:
            limit = f"its deadline (its commands' timeout_s plus {BATCH_GRACE_S:g}s, as the node sets no timeout_s)"
        return (
            f"the attempt did not finish within {limit}; the device was told to stop. "
            "Raise timeout_s if the work needs longer."
        )

    def _queue_timeout(self, timer: QueueTimeout, now: float) -> None:
        key = timer.key
        run = self.tasks.get(key[0])
        if run is None or not run.has(key[1]):
            return
        rec = run.record(key[1])
        if rec.state not in (NodeState.READY, NodeState.QUEUED) or rec.ready_since != timer.since:
            return
        limit = rec.spec.queue_timeout_s or self.settings.queue_timeout_s
        self.queues.take(key)
        message = (
            f"no capable device took this node within queue_timeout_s={limit:g}; check that a "
            "matching device is connected and in service, or raise queue_timeout_s"
        )
        self.apply(run, run.fail(key[1], ErrorCode.QUEUE_TIMEOUT, message, now), now)

    def apply(self, run: TaskRun, transitions: list[Transition], now: float) -> None:
        """Persist transitions, emit their events and keep the ready/queue indexes true."""
        for t in transitions:
            if isinstance(t, TaskTransition):
                self._task_transition(run, t, now)
            else:
                self._node_transition(run, t, now)
        if run.held and run.held - run.replanning:
            self.llm.replan_held(run, now)

    def _node_transition(self, run: TaskRun, t: NodeTransition, now: float) -> None:
        unit, new = t.node_id, t.new
        key = (run.id, unit)
        rec = run.record(unit)
        state = new.value  # the text stored and announced
        counter = self._transitions.get(new)
        if counter is None:
            counter = self._transitions[new] = self.metrics.node_transitions.labels(state)
        counter.inc()
        if t.old is NodeState.QUEUED and new is not NodeState.QUEUED:
            self.queues.take(key)
        fans_out = new is NodeState.READY and rec.spec.for_each is not None and unit in run.nodes
        if fans_out:
            self.queues.not_ready(key)  # it is never placed itself: its children are
        elif new is NodeState.READY:
            self.queues.make_ready(key)
            limit = rec.spec.queue_timeout_s or self.settings.queue_timeout_s
            if rec.ready_since is not None:
                self.timers.add(rec.ready_since + limit, QueueTimeout(key, rec.ready_since))
            if rec.not_before:
                self.timers.add(rec.not_before, Wake())
        else:
            self.queues.not_ready(key)
        values: dict[str, Any] = {
            "state": state,
            "attempts": rec.attempts,
            "queued_on": rec.queued_on,
            "ready_since": utc(rec.ready_since) if rec.ready_since else None,
            "not_before": utc(rec.not_before) if rec.not_before else None,
        }
        if new in TERMINAL_NODE_STATES:
            values.update(output=rec.output, results=rec.results, error=rec.error, finished_at=utc(now))
        elif new is NodeState.VERIFYING:  # what it ends with if its verify commands pass
            values.update(output=rec.output, results=rec.results)
        elif new is NodeState.RUNNING and t.old is NodeState.READY and rec.spec.for_each is not None:
            values["started_at"] = utc(now)  # a fan-out node starts with its children
        if rec.error and new in (NodeState.FAILED, NodeState.READY, NodeState.CANCELLED, NodeState.SKIPPED):
            self.fanouts.record(run, unit, now, values, error=rec.error)
        else:
            self.fanouts.record(run, unit, now, values)
        if fans_out:
            self.apply(run, self.fanouts.expand(run, unit, now), now)

    def _task_transition(self, run: TaskRun, t: TaskTransition, now: float) -> None:
        values: dict[str, Any] = {"state": t.new.value}
        if t.new.terminal:
            values["finished_at"] = utc(now)
            self.writer.effect(lambda: self._forget(run.id))
        self.writer.update(Task, (run.id,), **values)
        self.writer.event(EventType.TASK_STATE, run.id, None, now, state=t.new.value)

    def _forget(self, task_id: str) -> None:
        run = self.tasks.pop(task_id, None)
        if run is not None:
            self.queues.forget(task_id, [unit for unit, _ in run.units()])


def _misfit(specs: list[CommandSpec], commands: list[Command], dev: DeviceRun) -> str | None:
    """Why a command whose references took their values no longer fits its tool's input schema on
    `dev` (the first such command), or None. The API checked the arguments as written at
    submission, where a reference's type is not known yet; this is the same check once it is, so
    the node fails here with the schema's own words instead of on the device with the tool's
    validation dump. Arguments no reference changed are not checked again."""
    for index, (spec, command) in enumerate(zip(specs, commands, strict=True)):
        if command.arguments == spec.arguments:
            continue
        schema = (dev.tools.get(command.tool) or {}).get("input_schema") or {}
        errors = schema_errors(command.tool, command.arguments, schema)
        if errors:
            found = "; ".join(message for _, message in errors)
            return f"command {index} ({command.tool}), with its references resolved: {found}"
    return None
