"""The engine: one loop that owns task and device runtime state.

Each step drains the inbox, applies every input to the in-memory model through the pure domain
functions, schedules ready nodes onto free devices, writes all resulting changes in ONE
transaction (group commit), and only then performs the effects: frames to devices, events to
subscribers, replies to waiting callers. State is in the store before anything is said about
it, so a restarted orchestrator rebuilds exactly what it promised (DESIGN, data flow).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import signal
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from tenacity import AsyncRetrying, stop_after_attempt, wait_exponential

from orchestrator.config import Settings
from orchestrator.domain import placement, templates
from orchestrator.domain.model import AdminState, DagSpec, NodeKind, NodeSpec, NodeState, TaskState
from orchestrator.domain.problems import Problem
from orchestrator.domain.run import AttemptOutcome, TaskRun, Transition
from orchestrator.engine import llm_work
from orchestrator.engine.devices import SOFT_FLUSH_S, DeviceInputs
from orchestrator.engine.intake import Admission, Submission
from orchestrator.engine.llm_work import PlannerHooks
from orchestrator.engine.records import (
    AgentDone,
    AgentStep,
    AttemptRun,
    CancelTask,
    DeviceChanged,
    DeviceHello,
    DeviceRun,
    FrameIn,
    Hearing,
    Input,
    LinkReport,
    LivenessChanged,
    NodeKey,
    PlanFailed,
    PlanReady,
    ReplanDone,
    Route,
    SubmitTask,
    TaskCreated,
    Wake,
)
from orchestrator.engine.restore import attempt_row, recover, task_from_bundle
from orchestrator.engine.results import ResultHandling
from orchestrator.engine.scheduling import Scheduling
from orchestrator.engine.times import batch_deadline, iso, utc
from orchestrator.engine.validation import known_tools, validate_against
from orchestrator.ids import new_id
from orchestrator.metrics import Metrics
from orchestrator.store.models import Attempt, Device, Edge, Node, Task
from orchestrator.store.repo import ChangeSet, Store
from protocol.errors import ErrorCode
from protocol.messages import (
    Cancel,
    Command,
    CommandBatch,
    Message,
    Result,
)

log = logging.getLogger("orrery.engine")

RECONCILE_LOOKBACK_S = 3600.0  # tasks created this long before the engine started are adopted too
DEVICE_RECONCILE_EVERY = 5  # device rows are compared every this many task reconciles


class DeviceLinks(Protocol):
    """What the engine needs from the gateway (through the cluster, which finds the replica)."""

    def send(self, device_id: str, message: Message, route: Route) -> bool:
        """Queue a frame for the device's current session; False only if it certainly cannot
        reach the device (no session holds it), True if it may."""
        ...

    def close(self, device_id: str, code: int, reason: str, route: Route) -> None: ...


class EventSink(Protocol):
    def publish(self, events: list[dict[str, Any]]) -> None:
        """Fan committed events out to subscribers; never blocks the engine and never raises
        (the events are in the store; readers fall back to it)."""
        ...


class Engine(DeviceInputs, Scheduling, ResultHandling):
    def __init__(
        self,
        settings: Settings,
        store: Store,
        bus: EventSink,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.store = store
        self.bus = bus
        self.clock = clock
        self.rng = rng
        self.links: DeviceLinks | None = None
        self.planner: PlannerHooks | None = None
        self.planning_to_resume: list[tuple[str, str]] = []  # (task id, request) found at start-up
        self.tasks: dict[str, TaskRun] = {}
        self.devices: dict[str, DeviceRun] = {}
        self.attempts: dict[str, AttemptRun] = {}  # open attempts by batch id
        self.ready: dict[NodeKey, None] = {}  # READY nodes not yet in a queue
        self.queued_at: dict[NodeKey, str] = {}  # QUEUED node -> device
        self._capable_cache: dict[tuple[Any, ...], list[str]] = {}
        self.inbox: asyncio.Queue[Input] = asyncio.Queue()
        # Recently closed attempts: (device, fence, ended with device results) -> dedup without I/O.
        self._closed: OrderedDict[str, tuple[str, int, bool]] = OrderedDict()
        self._timers: list[tuple[float, int, str, Any]] = []
        self._timer_seq = 0
        self._changes = ChangeSet()
        self._soft = ChangeSet()  # changes that may wait for the next commit (see SOFT_FLUSH_S)
        self._soft_since: float | None = None
        self._effects: list[Callable[[], None]] = []
        self._events: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self.ready_event = asyncio.Event()
        self.failed: BaseException | None = None
        self.lease_guard: tuple[str, str, int] | None = None
        self.metrics = Metrics()
        self.metrics.watch(self)  # replicated: the engine lease every commit re-checks
        self.on_fatal: Callable[[BaseException], None] = _terminate
        self.replica_id = "local"  # the replica this engine runs on (its own devices need no bus)
        self.deaf = False  # cannot hear other replicas now (see `Hearing`)
        self.planning: set[str] = set()  # tasks whose plan the planner is working on
        self.recovered_at: float | None = None
        self._next_reconcile: float | None = None
        self._reconciles = 0
        self.history_written: set[str] = set()  # devices whose history grew since it was last pruned
        # Submissions admitted lately, by "id:<task id>" and "key:<Idempotency-Key>": a submission
        # asked again, or a key reused, in the same step as the first sees it before the store does.
        self._admitted: OrderedDict[str, Admission] = OrderedDict()

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
            for task_id, request in self.planning_to_resume:
                self._start_planning(task_id, request)
            self.planning_to_resume.clear()
            self.ready_event.set()
            await self._loop()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.critical("the engine stopped on an unexpected error; stopping the orchestrator", exc_info=exc)
            self.failed = exc
            self.ready_event.set()
            self.on_fatal(exc)

    def _start_planning(self, task_id: str, request: str) -> None:
        if self.planner is not None and task_id not in self.planning:
            self.planning.add(task_id)
            self.planner.start_planning(task_id, request)

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

    async def _loop(self) -> None:
        while True:
            await self.step(await self._next_inputs())

    async def step(self, items: list[Input]) -> None:
        """One engine step: apply `items`, fire due timers, schedule, commit, then act and reply.

        A failing input is refused (its caller gets the exception) and the step goes on; a
        failing commit propagates, and the caller stops the engine: the store refused what
        memory now believes, and only a restart from the store is trustworthy again."""
        now = self.clock()
        replies: list[tuple[asyncio.Future[Any], Any]] = []
        for item in items:
            try:
                reply = await self._handle(item, now)
            except Exception as exc:  # a bad input must not stop the engine
                log.exception("engine input %s failed", type(item).__name__)
                if item.done and not item.done.done():
                    item.done.set_exception(exc)
                continue
            if item.done:
                replies.append((item.done, reply))
        self._fire_timers(now)
        await self._reconcile_if_due(now)
        self._schedule(now)
        await self._commit()
        for fut, value in replies:
            if not fut.done():
                fut.set_result(value)

    async def _next_inputs(self) -> list[Input]:
        """Everything queued, waiting for the first input or the next timer, whichever is first."""
        if self.inbox.empty():
            delay = max(0.0, self._timers[0][0] - self.clock()) if self._timers else None
            try:
                async with asyncio.timeout(delay):
                    first = await self.inbox.get()
            except TimeoutError:
                return []
        else:
            first = self.inbox.get_nowait()
        items = [first]
        while not self.inbox.empty() and len(items) < 2000:
            items.append(self.inbox.get_nowait())
        return items

    async def _commit(self) -> None:
        changes, effects, events = self._changes, self._effects, self._events
        self._changes, self._effects, self._events = ChangeSet(), [], []
        soft_due = self._soft_since is not None and self.clock() - self._soft_since >= SOFT_FLUSH_S
        if self._soft and (changes or events or soft_due):
            merged, self._soft, self._soft_since = self._soft, ChangeSet(), None
            merged.absorb(changes)  # the later, hard changes win on the same row
            changes = merged
        if changes or events:
            changes.guard = self.lease_guard
            for ev in events:
                changes.event(ev)
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(5), wait=wait_exponential(multiplier=0.1, max=2), reraise=True
            ):
                with attempt:
                    ids = await self.store.write(changes)
            for ev, event_id in zip(events, ids, strict=True):
                ev["id"] = event_id
        for effect in effects:
            try:
                effect()
            except Exception:
                log.exception("engine effect failed")
        if events:
            try:
                self.bus.publish(events)
            except Exception:  # fan-out is a hint: the events are stored and readers poll the store
                log.exception("publishing %d events failed", len(events))

    # ================================================================ inputs

    async def _handle(self, item: Input, now: float) -> Any:
        if isinstance(item, FrameIn):
            return await self._on_frame(item.device_id, item.message, now)
        if isinstance(item, SubmitTask):
            return await self._on_submit(item.submission, item.asked_before, now)
        if isinstance(item, TaskCreated):
            return await self._on_task_created(item.task_id, item.run, now)
        if isinstance(item, CancelTask):
            return self._on_cancel(item.task_id, now)
        if isinstance(item, DeviceHello):
            return self._on_hello(item, now)
        if isinstance(item, LivenessChanged):
            return self._on_liveness(item.device_id, item.liveness, now, item.epoch, item.replica)
        if isinstance(item, LinkReport):
            return self._on_report(item, now)
        if isinstance(item, Hearing):
            return self._on_hearing(item.up, now)
        if isinstance(item, DeviceChanged):
            return await self._on_device_changed(item.device_id, now)
        if isinstance(item, Wake):
            return None
        if isinstance(item, AgentStep):
            return llm_work.on_agent_step(self, item, now)
        if isinstance(item, AgentDone):
            return llm_work.on_agent_done(self, item, now)
        if isinstance(item, ReplanDone):
            return llm_work.on_replan_done(self, item, now)
        if isinstance(item, PlanReady):
            self.planning.discard(item.task_id)
            return llm_work.on_plan_ready(self, item, now)
        if isinstance(item, PlanFailed):
            self.planning.discard(item.task_id)
            return llm_work.on_plan_failed(self, item, now)
        raise TypeError(f"unknown engine input {item!r}")

    async def _on_submit(self, sub: Submission, asked_before: bool, now: float) -> Admission:
        """Insert a new task in this step's commit and start it: the engine is the one writer of
        tasks. A submission asked again (its answer was lost between replicas) or an
        Idempotency-Key used before gets the task made then, never a second one."""
        marks = [f"id:{sub.task_id}"] + ([f"key:{sub.idempotency_key}"] if sub.idempotency_key else [])
        for mark in marks:
            if (earlier := self._admitted.get(mark)) is not None:
                return {**earlier, "created": earlier["task_id"] == sub.task_id}
        row = (
            await self.store.find_admitted(sub.task_id, sub.idempotency_key)
            if asked_before or sub.idempotency_key
            else None
        )
        if row is not None:
            return {"task_id": row.id, "created": row.id == sub.task_id, "body_hash": row.body_hash or ""}
        admitted: Admission = {"task_id": sub.task_id, "created": True, "body_hash": sub.body_hash}
        for mark in marks:
            self._admitted[mark] = admitted
        while len(self._admitted) > 10_000:
            self._admitted.popitem(last=False)
        self._changes.insert(Task, sub.task_row())
        nodes, edges = sub.graph_rows()
        for node in nodes:
            self._changes.insert(Node, node)
        for edge in edges:
            self._changes.insert(Edge, edge)
        self._event("task.state", sub.task_id, None, now, state=sub.state.value)
        if sub.spec is None:
            if self.planner is not None:  # the plan is asked for once the task is stored
                self.planning.add(sub.task_id)
                self._effects.append(functools.partial(self.planner.start_planning, sub.task_id, sub.request or ""))
            return admitted
        run = sub.run()
        llm_work.adopt(self, run)
        self.tasks[sub.task_id] = run
        self._apply(run, run.start(now), now)
        return admitted

    async def _on_task_created(self, task_id: str, run: TaskRun | None, now: float) -> None:
        if task_id in self.tasks:
            return
        if run is None:
            bundle = await self.store.get_task(task_id)
            if bundle is None or TaskState(bundle.task.state).terminal:
                return
            if bundle.task.state == TaskState.PLANNING:
                self._start_planning(task_id, bundle.task.request or "")
                return
            run = task_from_bundle(bundle)
        llm_work.adopt(self, run)
        self.tasks[task_id] = run
        self._apply(run, run.start(now), now)

    def _on_cancel(self, task_id: str, now: float) -> bool:
        run = self.tasks.get(task_id)
        if run is None or run.terminal:
            return False
        for att in list(self.attempts.values()):
            if att.task_id != task_id or att.kind == "step":
                continue
            if att.kind == "agent":
                llm_work.stop_agent(self, att, ErrorCode.CANCELLED, "the task was cancelled", now, "cancelled")
            else:
                self._send_cancel(att, "cancelled")
        self._changes.update(Task, (task_id,), cancel_requested=True)
        self._apply(run, run.cancel(now), now)
        return True

    # ================================================================ attempts

    def _end_attempt(
        self, att: AttemptRun, outcome: AttemptOutcome, now: float, results: list[Result] | None = None
    ) -> None:
        dev = self.devices.get(att.device_id)
        if dev is not None and dev.current_batch == att.batch_id:
            # The engine is done with this batch, however it ended (results, a timeout, a refusal,
            # the device lost): the device takes work again. If it is in fact still finishing
            # it, its agent queues the next batch behind it (one batch at a time, SPEC section 5).
            self._set_current(dev, None)
        if att.kind == "step":
            dumped = [r.model_dump(mode="json") for r in results] if results is not None else None
            llm_work.end_step(self, att, outcome, dumped, now)
            return
        if att.kind == "agent" and self.planner is not None:
            self.planner.cancel_agent(att.batch_id)
        self.attempts.pop(att.batch_id, None)
        self.metrics.batches.labels("succeeded" if outcome.succeeded else outcome.error_code or "failed").inc()
        self.metrics.command_roundtrip.observe(max(0.0, now - att.started))
        if not outcome.succeeded:
            log.info(
                "attempt failed: %s",
                outcome.error_code,
                extra={
                    "task_id": att.task_id,
                    "node_id": att.node_id,
                    "batch_id": att.batch_id,
                    "device_id": att.device_id,
                },
            )
        self._closed[att.batch_id] = (att.device_id, att.fence, results is not None)
        if len(self._closed) > 10_000:
            self._closed.popitem(last=False)
        status = "succeeded" if outcome.succeeded else "failed"
        error = None if outcome.succeeded else {"code": outcome.error_code, "message": outcome.error_message}
        self._changes.update(
            Attempt,
            (att.batch_id,),
            status=status,
            ended_at=utc(now),
            results=[r.model_dump(mode="json") for r in results] if results is not None else None,
            error=error,
        )
        self._event(
            "node.attempt",
            att.task_id,
            att.node_id,
            now,
            state=status,
            attempt=att.n,
            batch_id=att.batch_id,
            device_id=att.device_id,
            error=error,
        )
        run = self.tasks.get(att.task_id)
        if run is not None:
            if not outcome.succeeded:
                run.nodes[att.node_id].failed_on.add(att.device_id)
            self._apply(run, run.attempt_ended(att.node_id, outcome, now, self.rng()), now)

    def _end_unanswered(self, att: AttemptRun, code: str, message: str, now: float) -> None:
        """End an attempt the device gave no results for (lost, timed out): whether it may run
        again depends on whether it may have started, and on the tools it would have run."""
        dev = self.devices.get(att.device_id)
        hints = tuple(dev.hints(c["tool"]) for c in att.commands) if dev else ()
        outcome = AttemptOutcome(
            succeeded=False,
            error_code=code,
            error_message=message,
            started=att.sent,
            tool_hints=hints,
            tools=tuple(str(c["tool"]) for c in att.commands) if dev else (),
            commands=tuple(range(len(hints))) if att.kind == "tool" else None,
        )
        self._end_attempt(att, outcome, now)

    def _assign(self, dev: DeviceRun, key: NodeKey, now: float) -> None:
        run = self.tasks[key[0]]
        rec = run.nodes[key[1]]
        if rec.spec.kind is NodeKind.AGENT:
            llm_work.assign_agent(self, dev, key, now)
            return
        try:
            commands = [
                {
                    "call_id": f"c{i + 1}",
                    "tool": c.tool,
                    "tool_type": dev.tools.get(c.tool, {}).get("tool_type", "action"),
                    "arguments": templates.resolve(c.arguments, run.outcome_of),
                    "timeout_s": c.timeout_s,
                }
                for i, c in enumerate(rec.spec.commands)
            ]
        except templates.TemplateError as exc:
            self._apply(run, run.fail(key[1], ErrorCode.TEMPLATE_ERROR, str(exc), now), now)
            return
        att = self._open_attempt(dev, key, commands, now)
        self._timer(now + self.settings.batch_accept_timeout_s, "accept_deadline", att.batch_id)
        self._effects.append(lambda: self._dispatch(att))

    def _open_attempt(
        self, dev: DeviceRun, key: NodeKey, commands: list[dict[str, Any]], now: float, kind: str = "tool"
    ) -> AttemptRun:
        """A new attempt of `key` on `dev`: next fence, device held, attempt stored, node running."""
        run = self.tasks[key[0]]
        rec = run.nodes[key[1]]
        dev.fence += 1
        att = AttemptRun(
            new_id("b"),
            key[0],
            key[1],
            rec.attempts + 1,
            dev.id,
            dev.fence,
            commands,
            batch_deadline(now, rec.spec.timeout_s, commands),
            kind=kind,
            sent=kind == "agent",
            started=now,
        )
        self.attempts[att.batch_id] = att
        self._set_current(dev, att.batch_id)
        self._changes.update(Device, (dev.id,), fence=dev.fence)
        self._changes.insert(Attempt, attempt_row(att, now, "running" if kind == "agent" else "dispatched"))
        self._apply(run, run.mark_running(key[1]), now)
        if att.n == 1:
            self._changes.update(Node, key, started_at=utc(now))
        if rec.ready_since:
            self.metrics.schedule_to_start.observe(max(0.0, now - rec.ready_since))
        ids = {"task_id": att.task_id, "node_id": att.node_id, "batch_id": att.batch_id, "device_id": dev.id}
        log.debug("batch dispatched", extra=ids)
        self._event(
            "node.attempt",
            att.task_id,
            att.node_id,
            now,
            state="dispatched",
            attempt=att.n,
            batch_id=att.batch_id,
            device_id=dev.id,
        )
        if att.deadline:
            self._timer(att.deadline, "attempt_deadline", att.batch_id)
        return att

    def _dispatch(self, att: AttemptRun) -> None:
        if att.batch_id not in self.attempts:
            return
        frame = CommandBatch(
            batch_id=att.batch_id,
            task_id=att.task_id,
            node_id=att.node_id,
            attempt=att.n,
            fence=att.fence,
            deadline=utc(att.deadline) if att.deadline else None,
            commands=[Command(**c) for c in att.commands],
        )
        att.sent = self._send(att.device_id, frame) or att.sent

    def _send_cancel(self, att: AttemptRun, reason: str) -> None:
        if att.cancel_reason is None:
            att.cancel_reason = reason
            self._changes.update(Attempt, (att.batch_id,), cancel_reason=reason)
            self._effects.append(lambda: self._send_cancel_frame(att))

    def _send_cancel_frame(self, att: AttemptRun) -> None:
        self._send(att.device_id, Cancel(batch_id=att.batch_id, reason=att.cancel_reason or "cancelled"))

    def _send(self, device_id: str, message: Message) -> bool:
        dev = self.devices.get(device_id)
        if self.links is None or dev is None:
            return False
        return self.links.send(device_id, message, dev.route)

    # ================================================================ scheduling

    def _set_current(self, dev: DeviceRun, batch_id: str | None) -> None:
        if dev.current_batch != batch_id:
            dev.current_batch = batch_id
            self._changes.update(Device, (dev.id,), current_batch_id=batch_id)
            if batch_id is None and dev.admin is AdminState.DRAINING:
                self._record_state(dev, "its last batch ended", self.clock())

    # ================================================================ timers

    # ================================================================ recording

    def _apply(self, run: TaskRun, transitions: list[Transition], now: float) -> None:
        """Persist transitions, emit their events and keep the ready/queue indexes true."""
        for t in transitions:
            if t.node_id is None:
                self._task_transition(run, t, now)
                continue
            key = (run.id, t.node_id)
            rec = run.nodes[t.node_id]
            new = NodeState(t.new)
            self.metrics.node_transitions.labels(new.value).inc()
            if t.old == NodeState.QUEUED and new is not NodeState.QUEUED:
                self._take_from_queue(key)
            if new is NodeState.READY:
                self.ready[key] = None
                limit = rec.spec.queue_timeout_s or self.settings.queue_timeout_s
                if rec.ready_since is not None:
                    self._timer(rec.ready_since + limit, "queue_timeout", (key, rec.ready_since))
                if rec.not_before:
                    self._timer(rec.not_before, "wake", None)
            else:
                self.ready.pop(key, None)
            values: dict[str, Any] = {
                "state": new.value,
                "attempts": rec.attempts,
                "queued_on": rec.queued_on,
                "ready_since": utc(rec.ready_since) if rec.ready_since else None,
                "not_before": utc(rec.not_before) if rec.not_before else None,
            }
            if new.terminal:
                values.update(output=rec.output, results=rec.results, error=rec.error, finished_at=utc(now))
            self._changes.update(Node, key, **values)
            extra: dict[str, Any] = {}
            if rec.error and new in (NodeState.FAILED, NodeState.READY, NodeState.CANCELLED):
                extra["error"] = rec.error
            self._event("node.state", run.id, t.node_id, now, state=new.value, **extra)

        if run.held - run.replanning:
            llm_work.maybe_replan(self, run, now)

    def _task_transition(self, run: TaskRun, t: Transition, now: float) -> None:
        values: dict[str, Any] = {"state": t.new}
        if TaskState(t.new).terminal:
            values["finished_at"] = utc(now)
            self._effects.append(lambda: self._forget(run.id))
        self._changes.update(Task, (run.id,), **values)
        self._event("task.state", run.id, None, now, state=t.new)

    def _forget(self, task_id: str) -> None:
        run = self.tasks.pop(task_id, None)
        if run is None:
            return
        for node_id in run.nodes:
            self.ready.pop((task_id, node_id), None)
            self._take_from_queue((task_id, node_id))

    def _event(self, type_: str, task_id: str, node_id: str | None, now: float, **data: Any) -> None:
        body = {"task_id": task_id, "at": iso(now), **data}
        if node_id is not None:
            body["node_id"] = node_id
        self._events.append({"task_id": task_id, "type": type_, "node_id": node_id, "data": body, "at": utc(now)})

    # ================================================================ reconciling with the store

    async def _reconcile_if_due(self, now: float) -> None:
        """Adopt what the store has and memory lacks (SPEC section 7: the store is the only
        truth): `TaskCreated` and `DeviceChanged` from other replicas are hints that may be lost."""
        due = self._next_reconcile
        if due is None or now < due:
            return
        self._next_reconcile = now + self.settings.reconcile_interval_s
        self._timer(self._next_reconcile, "wake", None)
        self._reconciles += 1
        try:
            await self._adopt_tasks(now)
            if self._reconciles % DEVICE_RECONCILE_EVERY == 0:
                await self._adopt_device_changes(now)
        except Exception as exc:  # the next round tries again; commits would fail loudly anyway
            log.warning("could not reconcile with the store: %s", exc)

    async def _adopt_tasks(self, now: float) -> None:
        since = utc((self.recovered_at or now) - RECONCILE_LOOKBACK_S)
        for task_id, state in await self.store.active_task_ids(since):
            if task_id not in self.tasks and task_id not in self.planning:
                log.info("adopting task %s found in the store (state %s)", task_id, state)
                await self._on_task_created(task_id, None, now)

    async def _adopt_device_changes(self, now: float) -> None:
        for device_id, name, admin, labels, token_hash in await self.store.device_admin():
            dev = self.devices.get(device_id)
            if (
                dev is None
                or dev.admin.value != admin
                or dev.name != name
                or dev.labels != labels
                or dev.token_hash != token_hash
            ):
                log.info("adopting a change of device %s found in the store", device_id)
                await self._on_device_changed(device_id, now)
        written, self.history_written = self.history_written, set()
        removed = await self.store.prune_device_history(sorted(written), self.settings.device_history_kept)
        if removed:
            log.info("pruned %d old device history entries", removed)

    # ================================================================ recovery

    async def recover(self) -> None:
        """Rebuild runtime state from the store after a start or a crash (SPEC section 4).
        `start` does this before looping; tests and simulations call it, then drive `step`."""
        now = self.clock()
        recover(self, await self.store.load_runtime(), now)
        self.recovered_at = now
        self._next_reconcile = now + self.settings.reconcile_interval_s
        self._timer(self._next_reconcile, "wake", None)
        self._timer(now + self.settings.link_report_interval_s, "sweep", None)
        await self._commit()
        log.info(
            "engine recovered %d tasks, %d open attempts, %d devices",
            len(self.tasks),
            len(self.attempts),
            len(self.devices),
        )

    # ================================================================ read side

    def known_tools(self) -> dict[str, dict[str, Any]]:
        return known_tools(self.devices.values())

    def validate(self, spec: DagSpec) -> list[Problem]:
        """Structural problems first; then every tool node must fit some enrolled device (SPEC 3)."""
        return validate_against(spec, list(self.devices.values()), self.settings.dag_limits)

    def inventory(self) -> list[dict[str, Any]]:
        """Devices a planner may use: id, name, platform, labels, state and tool catalogue."""
        return [
            {
                "id": d.id,
                "name": d.name,
                "platform": d.platform,
                "labels": d.merged_labels(),
                "state": placement.state_of(d.view()).value,
                "tools": list(d.tools.values()),
            }
            for d in self.devices.values()
            if d.admin is AdminState.ACTIVE and d.tools
        ]

    def device_views(self) -> list[placement.DeviceView]:
        return [d.view() for d in self.devices.values()]

    def node_spec(self, task_id: str, node_id: str) -> NodeSpec | None:
        run = self.tasks.get(task_id)
        return run.nodes[node_id].spec if run and node_id in run.nodes else None


def _terminate(_exc: BaseException) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
