"""An input the store refused for its data is isolated, and memory made to agree with the store.

The refused input was applied to memory before its changes were refused (`StepWriter.commit`
leaves them out). So the tasks and devices it wrote are reloaded from the store, the one truth,
dropping whatever memory alone believed; then, for an input from a device, the attempts of those
tasks on that device end `input_refused` (never retried: what the device reports about that work
cannot be stored, and would be refused again), through the engine's normal path, and written in
a following commit. An input from the API is only refused: its caller has the error, and its
task goes on as the store has it. Only a failure of the store itself, or a refusal of this
module's own writes (a broken invariant), stops the engine.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.domain.model import NodeState, TaskState
from orchestrator.domain.run import TaskRun
from orchestrator.engine import restore
from orchestrator.engine.approvals import ApprovalBook
from orchestrator.engine.attempts import Attempts, unanswered
from orchestrator.engine.fleet import Fleet
from orchestrator.engine.llm_work import LlmWork
from orchestrator.engine.queues import Queues
from orchestrator.engine.records import AttemptKind, FrameIn, Input
from orchestrator.engine.runs import Runs
from orchestrator.engine.timers import AcceptDeadline, AttemptDeadline, QueueTimeout, Wake
from orchestrator.engine.writer import STEP_WORK
from orchestrator.metrics import Metrics
from orchestrator.store.models import Attempt, Device, Node, NodeChild, Task
from orchestrator.store.repo import ChangeSet, Store
from protocol.errors import ErrorCode

log = logging.getLogger("orrery.engine")


def touched(part: ChangeSet, attempts: Attempts) -> tuple[set[str], set[str]]:
    """The task ids and device ids whose rows (or events) `part` wrote."""
    tasks: set[str] = {str(ev["task_id"]) for ev in part.events if ev.get("task_id")}
    devices: set[str] = set()
    for model, rows in part.inserts.items():
        for row in rows:
            if model is Task:
                tasks.add(str(row["id"]))
            elif model is Device:
                devices.add(str(row["id"]))
            elif row.get("task_id"):
                tasks.add(str(row["task_id"]))
    for model, by_key in part.updates.items():
        for key in by_key:
            if model in (Task, Node, NodeChild):
                tasks.add(str(key[0]))
            elif model is Device:
                devices.add(str(key[0]))
            elif model is Attempt and (att := attempts.get(str(key[0]))) is not None:
                tasks.add(att.task_id)
    for model, keys in part.deletes.items():
        if model is Device:
            devices.update(str(k[0]) for k in keys)
        elif model in (Task, Node, NodeChild):
            tasks.update(str(k[0]) for k in keys)
    return tasks, devices


class Isolation:
    def __init__(
        self,
        store: Store,
        tasks: dict[str, TaskRun],
        attempts: Attempts,
        approvals: ApprovalBook,
        queues: Queues,
        fleet: Fleet,
        runs: Runs,
        llm: LlmWork,
        metrics: Metrics,
    ) -> None:
        self.store = store
        self.tasks = tasks
        self.attempts = attempts
        self.approvals = approvals
        self.queues = queues
        self.fleet = fleet
        self.runs = runs
        self.llm = llm
        self.metrics = metrics

    async def refused(
        self, items: list[Input], refused: dict[int, BaseException], parts: dict[int, ChangeSet], now: float
    ) -> None:
        """Each refused input: logged once, what it touched reloaded, its device's work on it ended."""
        step_work = parts.get(STEP_WORK)
        if step_work is not None:  # the step's own work, left out: what it touched is reloaded
            task_ids, device_ids = touched(step_work, self.attempts)
            log.warning("the step's own work was left out with it; reloading tasks %s", sorted(task_ids))
            await self._reload(task_ids, device_ids, now)
        for index in sorted(i for i in refused if i >= 0):
            item, exc = items[index], refused[index]
            what = getattr(getattr(item, "message", None), "type", "")
            who = getattr(item, "device_id", None) or getattr(item, "task_id", None) or "-"
            task_ids, device_ids = touched(parts.get(index) or ChangeSet(), self.attempts)
            log.error(
                "engine input %s %s (%s) refused by the store, left out; isolating tasks %s, devices %s: %s",
                type(item).__name__,
                what,
                who,
                sorted(task_ids),
                sorted(device_ids),
                exc,
            )
            self.metrics.errors.labels("input_refused").inc()
            await self._reload(task_ids, device_ids, now)
            if isinstance(item, FrameIn):
                self._end_work(item.device_id, task_ids, type(exc).__name__, now)

    async def _reload(self, task_ids: set[str], device_ids: set[str], now: float) -> None:
        for device_id in sorted(device_ids):
            await self.reload_device(device_id)
        for task_id in sorted(task_ids):
            await self.reload_task(task_id, now)

    def _end_work(self, device_id: str, task_ids: set[str], why: str, now: float) -> None:
        # Only the refusal's kind is stored: its text may quote what could not be stored.
        message = f"the store refused what device {device_id} reported about this work ({why}); it ends here"
        dev = self.fleet.devices.get(device_id)
        for att in self.attempts.on_device(device_id):
            if att.task_id not in task_ids or self.attempts.get(att.batch_id) is None:
                continue
            if att.kind is AttemptKind.AGENT:
                stopped = self.llm.stop_agent(att, ErrorCode.INPUT_REFUSED, message, now, "input_refused")
                self.runs.end_agent(stopped, now)
            elif att.kind is not AttemptKind.STEP:  # a step ends with its agent
                self.runs.outbox.cancel(att, ErrorCode.INPUT_REFUSED)
                self.runs.end_attempt(att, unanswered(att, dev, ErrorCode.INPUT_REFUSED, message), now)

    async def reload_device(self, device_id: str) -> None:
        """What the store holds of a device replaces memory's; its connection is memory's alone."""
        dev, row = self.fleet.devices.get(device_id), await self.store.get_device(device_id)
        if dev is None or row is None:
            return
        fresh = restore.device_from_row(row)
        for name in ("name", "labels", "reported_labels", "platform", "tools", "admin", "fence", "current_batch"):
            setattr(dev, name, getattr(fresh, name))
        dev.token_hash, dev.cordon_reason, dev.applied_gen = fresh.token_hash, fresh.cordon_reason, fresh.applied_gen
        dev.take_controls(fresh.controls())
        dev.owner_takeover, dev.features = fresh.owner_takeover, restore.features_of(row)
        self.queues.devices_changed()

    async def reload_task(self, task_id: str, now: float) -> None:
        """Forget memory's task (its run, open attempts, approvals waiting, queue places and
        verifications), then take it in again from the store, as a restart would."""
        old = self.tasks.pop(task_id, None)
        if old is not None:
            units = [unit for unit, _ in old.units()]
            for unit in units:
                self.queues.take((task_id, unit))
            self.queues.forget(task_id, units)
        for att in self.attempts.of_task(task_id):
            self.attempts.drop(att)
        self.approvals.forget_task(task_id)
        for key in [k for k in self.runs.verify.pending if k[0] == task_id]:
            del self.runs.verify.pending[key]
        bundle = await self.store.get_task(task_id)
        if bundle is None or TaskState(bundle.task.state).terminal or bundle.task.state == TaskState.PLANNING:
            return
        run = restore.task_from_bundle(bundle)
        found = [restore.attempt_from_row(a, a.node_id in run.rollouts) for a in bundle.attempts if a.ended_at is None]
        by_id = {a.batch_id: a for a in found}
        for att in found:
            self.attempts.add(att)
            self.attempts.closed.pop(att.batch_id, None)
            parent = by_id.get(att.parent or "")
            if att.kind is AttemptKind.STEP and parent is not None:
                parent.step = att.batch_id
        self.llm.adopt(run)
        self.tasks[task_id] = run
        timers, settings = self.runs.timers, self.runs.settings
        for att in found:  # timers fired in a step left out are armed again (stale ones are ignored)
            if att.deadline and att.kind is not AttemptKind.STEP:
                timers.add(att.deadline, AttemptDeadline(att.batch_id))
            if att.kind is not AttemptKind.AGENT and not att.accepted:
                timers.add(now + settings.batch_accept_timeout_s, AcceptDeadline(att.batch_id))
        for unit, rec in list(run.units()):  # as `Engine._settle` does after a restart
            key = (task_id, unit)
            if rec.state is NodeState.READY and rec.spec.for_each is not None and unit in run.nodes:
                self.runs.apply(run, self.runs.fanouts.expand(run, unit, now), now)
            elif rec.state is NodeState.READY:
                self.queues.make_ready(key)
            elif rec.state is NodeState.QUEUED:
                holder = self.fleet.devices.get(rec.queued_on or "")
                if holder is not None:
                    self.queues.enqueue(key, holder)
                else:
                    self.runs.apply(run, run.unqueue(unit), now)
            if rec.state in (NodeState.READY, NodeState.QUEUED) and rec.ready_since:
                limit = rec.spec.queue_timeout_s or settings.queue_timeout_s
                timers.add(rec.ready_since + limit, QueueTimeout(key, rec.ready_since))
            if rec.not_before:
                timers.add(rec.not_before, Wake())
        rows: list[Any] = [r for r in await self.store.approvals_to_restore() if r.task_id == task_id]
        self.approvals.restore(rows, now)
        for unit, data in restore.verifications(bundle):
            if run.has(unit) and run.record(unit).state is NodeState.VERIFYING:
                self.runs.verify.restore(run, unit, data, now)
        self.runs.apply(run, run.start(now), now)
