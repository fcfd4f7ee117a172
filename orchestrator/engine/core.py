"""The engine: one loop that owns task and device runtime state.

Each step drains the inbox, applies every input to the in-memory model through the pure domain
functions, schedules ready nodes onto free devices, writes all resulting changes in ONE
transaction (group commit), and only then performs the effects: frames to devices, events to
subscribers, replies to waiting callers. State is in the store before anything is said about
it, so a restarted orchestrator rebuilds exactly what it promised (DESIGN, data flow).

The engine is the loop and a dispatch table (input type -> handler) over its collaborators, each
in its own module: the step writer (`writer`), typed timers (`timers`), the queues and placement
(`queues`), open attempts and results (`attempts`), the devices (`fleet`), frames out (`outbox`),
new tasks (`admissions`: the engine is the one writer of tasks), LLM work (`llm_work`) and
recovery from rows (`restore`). Recording transitions and opening and ending attempts are the
tasks' runs (`runs`); what is left here is the loop, the dispatch, reconciling and recovery.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from orchestrator.config import Settings
from orchestrator.domain import placement, recording
from orchestrator.domain.model import DagSpec, Liveness, NodeSpec, NodeState, TaskState
from orchestrator.domain.problems import Problem
from orchestrator.domain.run import TaskRun
from orchestrator.engine import restore, timers
from orchestrator.engine.admissions import Admissions
from orchestrator.engine.approvals import ApprovalBook
from orchestrator.engine.attempts import Applied, Attempts, Duplicate
from orchestrator.engine.fleet import Fleet
from orchestrator.engine.inbox import Inbox
from orchestrator.engine.intake import Admission
from orchestrator.engine.isolation import Isolation
from orchestrator.engine.llm_work import LlmWork, PlannerHooks
from orchestrator.engine.outbox import DeviceLinks, Outbox
from orchestrator.engine.queues import Queues
from orchestrator.engine.records import (
    AgentDone,
    AgentStep,
    AttemptKind,
    AttemptRun,
    CancelTask,
    ControlDevice,
    DecideApproval,
    DeviceChanged,
    DeviceHello,
    DeviceRun,
    FrameIn,
    Hearing,
    Input,
    LinkReport,
    LivenessChanged,
    PlanFailed,
    PlanReady,
    ReplanDone,
    SubmitTask,
    TaskCreated,
    Wake,
)
from orchestrator.engine.runs import Runs
from orchestrator.engine.schedule_records import ChangeSchedule
from orchestrator.engine.schedules import ScheduleBook
from orchestrator.engine.takeovers import Takeovers
from orchestrator.engine.timers import AcceptDeadline, AttemptDeadline, QueueTimeout, Sweep, Timers
from orchestrator.engine.times import utc
from orchestrator.engine.validation import validate_against
from orchestrator.engine.writer import EventSink, StepWriter
from orchestrator.ids import new_id
from orchestrator.metrics import EngineGauges, Metrics
from orchestrator.store.repo import Store
from protocol.errors import ErrorCode
from protocol.messages import (
    ApprovalDecision,
    ApprovalRequest,
    BatchAccepted,
    Error,
    OwnerTakeover,
    ResultBatch,
    SafetyBreach,
    ToolsChanged,
)

log = logging.getLogger("orrery.engine")

RECONCILE_LOOKBACK_S = 3600.0  # tasks created this long before the engine started are adopted too
DEVICE_RECONCILE_EVERY = 5  # device rows are compared every this many task reconciles
# A pass over the device rows reads this many per step: a step stays short at 10,000 devices
# (the loop also answers heartbeats), and the pass ends a few steps later.
DEVICE_PAGE = 500

Handler = Callable[[Any, float], Awaitable[Any]]


class Engine:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        bus: EventSink,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        ids: Callable[[str], str] = new_id,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`clock`, `rng`, `ids` (batch ids) and `sleep` (between commit retries) are the engine's
        only links to time and chance; a simulation passes its own (tests/sim)."""
        self.settings = settings
        self.store = store
        self.bus = bus
        self.clock = clock
        self.rng = rng
        self.tasks: dict[str, TaskRun] = {}
        self.timers = Timers()
        self.writer = StepWriter(store, bus, self.timers, clock, sleep)
        self.attempts = Attempts(store, ids=ids)
        devices: dict[str, DeviceRun] = {}
        self.queues = Queues(self.tasks, devices)
        self.outbox = Outbox(devices, self.attempts, self.writer)
        self.fleet = Fleet(settings, store, self.writer, self.queues, self.attempts, self.outbox, devices)
        self.llm = LlmWork(
            settings,
            self.tasks,
            self.writer,
            self.attempts,
            self.fleet,
            self.queues,
            self.outbox,
            self.timers,
            lambda run, transitions, now: self.runs.apply(run, transitions, now),  # noqa: PLW0108 (made below)
        )
        self.metrics = Metrics()
        self.runs = Runs(
            settings,
            self.tasks,
            self.writer,
            self.timers,
            self.queues,
            self.attempts,
            self.fleet,
            self.outbox,
            self.llm,
            self.metrics,
            rng,
        )
        self.approvals = ApprovalBook(
            settings,
            store,
            self.tasks,
            self.writer,
            self.timers,
            self.attempts,
            self.outbox,
            self.runs.apply,
        )
        self.runs.on_approval_expiry = self.approvals.expire
        self.takeovers = Takeovers(self.tasks, self.attempts, self.writer, self.timers, self.approvals, self.runs.apply)
        self.llm.takeovers = self.takeovers
        self.runs.on_takeover = self.takeovers.changed
        self.runs.on_attempt_end = self._attempt_ending
        self.admissions = Admissions(store, self.writer)
        self.isolation = Isolation(
            store, self.tasks, self.attempts, self.approvals, self.queues, self.fleet, self.runs, self.llm, self.metrics
        )
        self.schedules = ScheduleBook(
            settings, store, self.writer, self.timers, ids, self.tasks, self.llm, self.metrics
        )
        self.schedules.start = lambda sub, now: self._on_submit(SubmitTask(sub), now)  # ticks' tasks: the intake
        self.inbox = Inbox()
        self._task: asyncio.Task[None] | None = None
        self.ready_event = asyncio.Event()
        self.failed: BaseException | None = None
        self.metrics.watch(self.gauges)
        self.on_fatal: Callable[[BaseException], None] = _terminate
        self.recovered_at: float | None = None
        self._next_reconcile: float | None = None
        self._reconciles = 0
        self._device_pass: str | None = None  # the last device id of a pass under way
        self._handlers: dict[type[Input], Handler] = {
            FrameIn: self._on_frame,
            SubmitTask: self._on_submit,
            TaskCreated: self._on_task_created,
            CancelTask: self._sync(lambda item, now: self.runs.cancel(item.task_id, now)),
            DeviceHello: self._sync(self._on_hello),
            LivenessChanged: self._sync(self._on_liveness),
            LinkReport: self._sync(self._on_report),
            Hearing: self._sync(lambda item, now: self.fleet.hearing(item.up, now)),
            DeviceChanged: self._on_device_changed,
            DecideApproval: self._sync(self.approvals.decide),
            ControlDevice: self._sync(self._on_control),
            Wake: self._sync(lambda item, now: None),
            AgentStep: self._sync(self.llm.agent_step),
            AgentDone: self._sync(lambda item, now: self.runs.end_agent(self.llm.agent_done(item, now), now)),
            ReplanDone: self._sync(self.llm.replan_done),
            PlanReady: self._sync(self.llm.plan_ready),
            PlanFailed: self._sync(self.llm.plan_failed),
            ChangeSchedule: self._sync(self.schedules.change),
        }

    @staticmethod
    def _sync(fn: Callable[[Any, float], Any]) -> Handler:
        async def handler(item: Any, now: float) -> Any:
            return fn(item, now)

        return handler

    # ================================================================ outward surface

    @property
    def devices(self) -> dict[str, DeviceRun]:
        return self.fleet.devices

    @property
    def links(self) -> DeviceLinks | None:
        return self.outbox.links

    @links.setter
    def links(self, links: DeviceLinks | None) -> None:
        self.outbox.links = links

    @property
    def planner(self) -> PlannerHooks | None:
        return self.llm.planner

    @planner.setter
    def planner(self, planner: PlannerHooks | None) -> None:
        self.llm.planner = planner

    @property
    def replica_id(self) -> str:
        return self.fleet.replica_id

    @replica_id.setter
    def replica_id(self, replica_id: str) -> None:
        self.fleet.replica_id = replica_id

    @property
    def lease_guard(self) -> tuple[str, str, int] | None:
        return self.writer.lease_guard

    @lease_guard.setter
    def lease_guard(self, guard: tuple[str, str, int] | None) -> None:
        self.writer.lease_guard = guard

    # ================================================================ lifecycle

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the engine was already started; a second loop would corrupt its state")
        self._task = asyncio.create_task(self._run(), name="orrery-engine")
        await self.ready_event.wait()
        if self.failed is not None:
            raise self.failed

    async def _run(self) -> None:
        """Recover, then loop. Any exception that escapes is fatal: memory may no longer match
        the store, so the process stops and a restart rebuilds from the store (fail fast)."""
        try:
            await self.recover()
            self.ready_event.set()
            while True:
                await self.step(await self._next_inputs())
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.critical("the engine stopped on an unexpected error; stopping the orchestrator", exc_info=exc)
            self.failed = exc
            self.ready_event.set()
            self.on_fatal(exc)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def submit(self, item: Input) -> asyncio.Future[Any]:
        """Queue an input; the future resolves after its changes are committed."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        item.done = fut
        self.inbox.put_nowait(item)
        return fut

    def notify(self, item: Input) -> None:
        self.inbox.put_nowait(item)

    # ================================================================ the loop

    async def step(self, items: list[Input]) -> None:
        """One engine step: apply `items`, fire due timers, schedule, commit, then act and reply.

        A failing input is refused (its caller gets the exception) and the step goes on; so is one
        whose changes the store refuses for their data (`StepWriter.commit` leaves them out, and
        `Isolation` reloads what it touched and ends its device's work on it). Any
        other failing commit propagates, and the caller stops the engine: the store refused what
        memory now believes, and only a restart from the store is trustworthy again."""
        now = self.clock()
        replies: list[tuple[int, asyncio.Future[Any], Any]] = []
        writer = self.writer
        for index, item in enumerate(items):
            writer.source = index  # what it writes is its own, should the store refuse it
            try:
                handler = self._handlers.get(type(item))
                if handler is None:
                    raise TypeError(f"unknown engine input {item!r}")
                reply = await handler(item, now)
            except Exception as exc:  # a bad input must not stop the engine
                log.exception("engine input %s failed", type(item).__name__)
                if item.done and not item.done.done():
                    item.done.set_exception(exc)
                continue
            if item.done:
                replies.append((index, item.done, reply))
        writer.source = None
        self.runs.fire_timers(now)
        if self.schedules.due(now):
            await self.schedules.fire(now)
        if self._device_pass is not None or (self._next_reconcile is not None and now >= self._next_reconcile):
            await self._reconcile_if_due(now)  # most steps have nothing to reconcile: no coroutine made
        self._schedule(now)
        refused = await writer.commit()
        if refused:  # memory made to agree with the store again, then what that wrote committed
            await self.isolation.refused(items, refused, writer.refused_parts, now)
            await writer.commit()
        for index, fut, value in replies:
            if not fut.done():
                if index in refused:
                    fut.set_exception(refused[index])
                else:
                    fut.set_result(value)

    async def _next_inputs(self) -> list[Input]:
        """Everything queued (at most 2,000), waiting for the first input or the next timer,
        whichever is first; empty if the timer came first."""
        if self.inbox.empty():
            at = self.timers.next_at()
            await self.inbox.wait(max(0.0, at - self.clock()) if at is not None else None)
        return self.inbox.take(2000)

    # ================================================================ inputs

    async def _on_submit(self, item: SubmitTask, now: float) -> Admission:
        """A new task: stored in this step's commit (the engine is the one writer of tasks) and
        started, or the task an earlier submission of it (or of its Idempotency-Key) made."""
        sub = item.submission
        answer, new = await self.admissions.admit(sub, item.asked_before, now)
        if not new:
            return answer
        if sub.spec is None:  # the plan is asked for once the task is stored
            self.writer.effect(functools.partial(self.llm.start_planning, sub.task_id, sub.request or ""))
            return answer
        run = sub.run()
        self.llm.adopt(run)
        self.tasks[sub.task_id] = run
        self.runs.apply(run, run.start(now), now)
        return answer

    async def _on_task_created(self, item: TaskCreated, now: float) -> None:
        task_id, run = item.task_id, item.run
        if task_id in self.tasks:
            return
        if run is None:
            bundle = await self.store.get_task(task_id)
            if bundle is None or TaskState(bundle.task.state).terminal:
                return
            if bundle.task.state == TaskState.PLANNING:
                self.llm.start_planning(task_id, bundle.task.request or "")
                return
            run = restore.task_from_bundle(bundle)
        self.llm.adopt(run)
        self.tasks[task_id] = run
        self.runs.apply(run, run.start(now), now)

    def _on_hello(self, item: DeviceHello, now: float) -> bool:
        current, actions = self.fleet.hello(item, now)
        self.runs.carry_out(actions, now)
        return current

    def _attempt_ending(self, att: AttemptRun, now: float) -> None:
        self.approvals.attempt_ended(att, now)  # its approvals not decided yet are asked to be cancelled
        self.takeovers.attempt_ended(att)  # a step it holds for a takeover is dropped

    def _on_liveness(self, item: LivenessChanged, now: float) -> None:
        self.runs.carry_out(self.fleet.liveness(item.device_id, item.liveness, now, item.epoch, item.replica), now)

    def _on_report(self, item: LinkReport, now: float) -> None:
        self.runs.carry_out(self.fleet.report(item, now), now)
        if self.approvals.waiting:  # requests its devices have not confirmed go again
            for link in item.links:
                dev = self.fleet.devices.get(link.device_id)
                if dev is not None and link.epoch >= dev.epoch and link.liveness is Liveness.ONLINE:
                    self.approvals.heard(dev, now)

    def _on_control(self, item: ControlDevice, now: float) -> dict[str, Any]:
        reply, actions = self.fleet.controls.control(item, now)
        self.runs.carry_out(actions, now)
        return reply

    async def _on_device_changed(self, item: DeviceChanged, now: float) -> None:
        self.runs.carry_out(await self.fleet.changed(item.device_id, now), now)

    async def _on_frame(self, item: FrameIn, now: float) -> None:
        dev = self.fleet.devices.get(item.device_id)
        msg = item.message
        if dev is None:
            return
        if isinstance(msg, ResultBatch):
            await self._on_results(dev, msg, now)
        elif isinstance(msg, BatchAccepted):
            att = self.attempts.get(msg.batch_id)
            if att is not None and att.device_id == dev.id:
                self.fleet.accepted(att, now)
        elif isinstance(msg, ToolsChanged):
            self.fleet.tools_changed(dev, msg)
        elif isinstance(msg, ApprovalRequest):
            await self.approvals.requested(dev, msg, now)
        elif isinstance(msg, ApprovalDecision):
            self.approvals.reported(dev, msg, now)
        elif isinstance(msg, OwnerTakeover):  # the owner took the device over at the device, or handed it back
            self.runs.carry_out(self.fleet.controls.owner_takeover(dev, msg.state, now), now)
        elif isinstance(msg, SafetyBreach):  # a breached safety budget cordons the device
            news, actions = self.fleet.controls.breach(dev, msg, now)
            if news:
                self.metrics.safety_breaches.labels(msg.budget).inc()
            self.runs.carry_out(actions, now)

    def _schedule(self, now: float) -> None:
        self.runs.schedule(now)

    async def _on_results(self, dev: DeviceRun, msg: ResultBatch, now: float) -> None:
        self.fleet.raise_fence(dev, msg.fence_seen)  # a device refusing a batch as stale says why
        verdict = await self.attempts.accept(dev, msg)
        if isinstance(verdict, Applied):
            self.runs.end_attempt(verdict.attempt, verdict.outcome, now, verdict.results)
            return
        if dev.current_batch == msg.batch_id:
            self.fleet.set_current(dev, None, now)  # the device finished work we had already given up on
        if isinstance(verdict, Duplicate):
            return  # a re-send of results already recorded: the ack it gets is all it needs
        log.warning("refused results from %s: %s", dev.id, verdict.message)
        self.outbox.send(dev.id, Error(code=verdict.code, message=verdict.message))

    # ================================================================ reconciling with the store

    async def _reconcile_if_due(self, now: float) -> None:
        """Adopt what the store has and memory lacks (SPEC section 7: the store is the only
        truth): `TaskCreated` and `DeviceChanged` from other replicas are hints that may be lost."""
        try:
            if self._device_pass is not None:
                await self._adopt_device_page(now)
            due = self._next_reconcile
            if due is None or now < due:
                return
            self._next_reconcile = now + self.settings.reconcile_interval_s
            self.timers.add(self._next_reconcile, timers.Wake())
            self._reconciles += 1
            await self._adopt_tasks(now)
            if self._reconciles % DEVICE_RECONCILE_EVERY == 0 and self._device_pass is None:
                self._device_pass = ""
                await self._adopt_device_page(now)
        except Exception as exc:  # the next round tries again; commits would fail loudly anyway
            self._device_pass = None
            log.warning("could not reconcile with the store: %s", exc)

    async def _adopt_tasks(self, now: float) -> None:
        since = utc((self.recovered_at or now) - RECONCILE_LOOKBACK_S)
        for task_id, state in await self.store.active_task_ids(since):
            if task_id not in self.tasks and task_id not in self.llm.planning:
                log.info("adopting task %s found in the store (state %s)", task_id, state)
                await self._on_task_created(TaskCreated(task_id), now)

    async def _adopt_device_page(self, now: float) -> None:
        """One page of a pass over the device rows: adopt what operators changed that memory
        missed. The next page is read in the next step, so no step holds the loop for the whole
        fleet; at the end of the pass, old device history is pruned."""
        after = self._device_pass or ""
        rows = await self.store.device_admin(after, DEVICE_PAGE)
        for device_id, name, _admin, labels, token_hash in rows:
            dev = self.fleet.devices.get(device_id)
            # The admin state is the engine's own (it is its one writer): only what the API writes
            # (enrollments, names, labels, tokens) can be news here.
            if dev is None or dev.name != name or dev.labels != labels or dev.token_hash != token_hash:
                log.info("adopting a change of device %s found in the store", device_id)
                await self._on_device_changed(DeviceChanged(device_id), now)
        if len(rows) == DEVICE_PAGE:
            self._device_pass = rows[-1][0]
            self.timers.add(now, timers.Wake())  # the next page, in the next step
            return
        self._device_pass = None
        written = self.fleet.take_history_written()
        removed = await self.store.prune_device_history(written, self.settings.device_history_kept)
        if removed:
            log.info("pruned %d old device history entries", removed)

    # ================================================================ recovery

    async def recover(self) -> None:
        """Rebuild runtime state from the store after a start or a crash (SPEC section 4).
        `start` does this before looping; tests and simulations call it, then drive `step`."""
        now = self.clock()
        self._settle(restore.load(await self.store.load_runtime(), now), now)
        self.approvals.restore(await self.store.approvals_to_restore(), now)
        self.schedules.restore(await self.schedules.load_rows(self.store), now)
        self.recovered_at = now
        self._next_reconcile = now + self.settings.reconcile_interval_s
        self.timers.add(self._next_reconcile, timers.Wake())
        self.timers.add(now + self.settings.link_report_interval_s, Sweep())
        await self.writer.commit()
        log.info(
            "engine recovered %d tasks, %d open attempts, %d devices",
            len(self.tasks),
            len(self.attempts.open),
            len(self.fleet.devices),
        )

    def _settle(self, found: restore.Recovered, now: float) -> None:
        """Take in what the store held, then settle what a crash left unsettled: queued nodes
        whose device is gone, failures still awaiting a re-plan, agent nodes whose conversation
        died with the process."""
        for dev in found.devices:
            self.fleet.devices[dev.id] = dev
        for task_id, request in found.planning:  # its plan died with the last process: ask again
            self.writer.effect(functools.partial(self.llm.start_planning, task_id, request))
        for att in found.attempts:
            self.attempts.add(att)
        runs = {r.id: r for r in found.tasks}
        for att in found.attempts:  # how it was recorded (a step as its agent attempt)
            run = runs.get(att.task_id)
            holder = self.fleet.devices.get(att.device_id)
            if run is not None and holder is not None and run.has(att.node_id):
                att.record = recording.mode(run.record(att.node_id).spec, holder.features)
        for run in found.tasks:
            self.llm.adopt(run)
            self.tasks[run.id] = run
            for node_id, rec in list(run.units()):
                key = (run.id, node_id)
                if rec.state is NodeState.READY and rec.spec.for_each is not None and node_id in run.nodes:
                    self.runs.apply(run, self.runs.fanouts.expand(run, node_id, now), now)  # not expanded yet
                elif rec.state is NodeState.READY:
                    self.queues.make_ready(key)
                elif rec.state is NodeState.QUEUED:
                    holder = self.fleet.devices.get(rec.queued_on or "")
                    if holder is None:
                        self.runs.apply(run, run.unqueue(node_id), now)
                    else:
                        self.queues.enqueue(key, holder)
                if rec.state in (NodeState.READY, NodeState.QUEUED) and rec.ready_since:
                    limit = rec.spec.queue_timeout_s or self.settings.queue_timeout_s
                    self.timers.add(rec.ready_since + limit, QueueTimeout(key, rec.ready_since))
                if rec.not_before:
                    self.timers.add(rec.not_before, timers.Wake())
                if rec.state is NodeState.FAILED and run.hold_failures and restore.held_when_stored(run, node_id):
                    run.held.add(node_id)  # its re-plan was under way: ask again
            # Successors of nodes that ended just before the crash may still be pending.
            self.runs.apply(run, run.start(now), now)
        for task_id, unit, stored in found.verifying:  # outcomes being verified
            run = self.tasks[task_id]
            if run.has(unit) and run.record(unit).state is NodeState.VERIFYING:
                self.runs.verify.restore(run, unit, stored, now)
        for att in list(self.attempts.open.values()):
            if att.kind is AttemptKind.STEP and self.attempts.get(att.parent) is not None:
                pass  # it ends with its agent attempt
            elif att.deadline:
                self.timers.add(att.deadline, AttemptDeadline(att.batch_id))
            if att.kind is not AttemptKind.AGENT and not att.accepted:
                self.timers.add(now + self.settings.batch_accept_timeout_s, AcceptDeadline(att.batch_id))
        for att in [a for a in self.attempts.open.values() if a.kind is AttemptKind.AGENT]:
            message = (
                "the orchestrator restarted while this agent node ran; "
                "its conversation was lost, and what it did on the device is uncertain"
            )
            self.runs.end_agent(self.llm.stop_agent(att, ErrorCode.UNCERTAIN, message, now, "restart"), now)

    # ================================================================ read side

    def known_tools(self) -> dict[str, dict[str, Any]]:
        return self.fleet.known_tools()

    def validate(self, spec: DagSpec) -> list[Problem]:
        """Structural problems first; then every tool node must fit some enrolled device (SPEC 3)."""
        return validate_against(spec, list(self.fleet.devices.values()), self.settings.dag_limits)

    def inventory(self) -> list[dict[str, Any]]:
        """Devices a planner may use: id, name, platform, labels, state and tool catalogue."""
        return self.fleet.inventory()

    def device_views(self) -> list[placement.DeviceView]:
        return [d.view() for d in self.fleet.devices.values()]

    def node_spec(self, task_id: str, node_id: str) -> NodeSpec | None:
        run = self.tasks.get(task_id)
        return run.nodes[node_id].spec if run and node_id in run.nodes else None

    def gauges(self) -> EngineGauges | None:
        """What `/metrics` reads at scrape time (None until the engine has recovered)."""
        if not self.ready_event.is_set():
            return None
        return EngineGauges(
            devices=Counter(placement.state_of(d.view()).value for d in self.fleet.devices.values()),
            nodes=Counter(r.state.value for run in self.tasks.values() for r in run.nodes.values()),
            queue_depth=self.queues.depth(),
        )


def _terminate(_exc: BaseException) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
