"""Schedules in the engine: the leader fires every tick inside its step.

A due tick's task goes in through the intake like any submission, and the task's rows, the tick's
record and the schedule's move to its next tick are in the writes of one step: one commit, guarded
by the engine lease. A crash before that commit leaves the schedule at the same tick, so the next
leader fires it again and makes its task then; a crash after it finds the tick recorded and moves
on. Either way there is one task per tick. The task also carries the tick's Idempotency-Key
(`domain.schedule.tick_key`), so a tick fired a second time for any reason finds the task it made.

The cron arithmetic of a tick (the ticks due, the next one) runs on a worker thread
(`cron_worker.off_loop`): a rare expression walks the calendar, and the engine shares its loop with
every request and device socket of the replica.

Schedules change only through this book (create, pause, resume, delete arrive as
`ChangeSchedule` inputs through the cluster), so the leader's memory and the store agree, and the
rules for ticks (`domain.schedule`) see every schedule as it is.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from orchestrator.config import Settings
from orchestrator.domain import cron as crons
from orchestrator.domain.cron import Cron
from orchestrator.domain.run import TaskRun
from orchestrator.domain.schedule import (
    SCHEDULE_LABEL,
    TICK_LABEL,
    Backlog,
    Overlap,
    TickOutcome,
    backlog,
    on_due,
    tick_key,
)
from orchestrator.engine.cron_worker import off_loop
from orchestrator.engine.intake import Admission, Submission
from orchestrator.engine.llm_work import LlmWork
from orchestrator.engine.schedule_records import (
    OK,
    ChangeSchedule,
    Reply,
    ScheduleAction,
    ScheduleRun,
    definition_of,
    entry_from,
)
from orchestrator.engine.timers import Timers, Wake
from orchestrator.engine.times import iso, utc
from orchestrator.engine.writer import StepWriter
from orchestrator.metrics import Metrics
from orchestrator.store import schedules as stored
from orchestrator.store.models import Schedule, ScheduleTick
from orchestrator.store.repo import Store

log = logging.getLogger("orrery.engine")

PRUNE_SLACK = 100  # ticks recorded past `schedule_ticks_kept` before the oldest are deleted
LATE_NOTE_S = 5.0  # a tick whose task starts later than this says why
NO_ENGINE = "no engine was running (a restart or a failover)"

Start = Callable[[Submission, float], Awaitable[Admission]]


async def _unwired(sub: Submission, now: float) -> Admission:
    raise RuntimeError("the schedule book was not given the engine's intake")


class ScheduleBook:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        writer: StepWriter,
        timers: Timers,
        ids: Callable[[str], str],
        tasks: dict[str, TaskRun],
        llm: LlmWork,
        metrics: Metrics,
    ) -> None:
        """`tasks` and `llm` are the engine's, read to tell whether a schedule's previous task is
        still running (or planning) and whether a planner is there; `start` is set by the engine
        to its intake, which admits a tick's task and starts it."""
        self.settings = settings
        self.store = store
        self.writer = writer
        self.timers = timers
        self.ids = ids
        self.tasks = tasks
        self.llm = llm
        self.metrics = metrics
        self.start: Start = _unwired
        self.entries: dict[str, ScheduleRun] = {}
        self._names: dict[str, str] = {}  # name -> id
        self._due: list[tuple[float, str]] = []  # (next_at, id); stale entries are skipped
        self._waiting: set[str] = set()  # schedules with queued ticks
        self._prune: set[str] = set()  # schedules with more tick records than kept
        self._started: set[str] = set()  # tasks made in this step (a planned one is not `running` yet)
        self._broken: dict[str, str] = {}  # id -> why a stored schedule cannot be evaluated (it never fires)
        # How the schedules are read at a start and their histories pruned (a simulation, whose
        # store holds rows in memory, brings its own).
        self.load_rows: Callable[[Store], Awaitable[stored.Loaded]] = stored.load
        self.prune_rows: Callable[[Store, str, int], Awaitable[int]] = stored.prune_ticks
        self.compute = off_loop  # where a tick's cron arithmetic runs

    # ---------------------------------------------------------------- recovery

    def restore(self, loaded: stored.Loaded, now: float) -> None:
        """Every schedule from the store after a start or a failover: armed at its stored next
        tick, which fires at once if it passed meanwhile (missed ticks: `domain.schedule`)."""
        for row in loaded.schedules:
            try:
                entry = entry_from(row.id, definition_of(row), now)
            except (crons.CronError, ValueError, KeyError) as exc:
                # Its zone left the tz database, say: it keeps its name and can be deleted, never fires.
                log.error("schedule %s (%s) cannot be evaluated and will not fire: %s", row.name, row.id, exc)
                self._broken[row.id] = (
                    f"schedule '{row.name}' cannot be evaluated ({exc}); delete it and create it again"
                )
                self._names[row.name] = row.id
                continue
            entry.paused = bool(row.paused)
            entry.next_at = _ts(row.next_at)
            entry.last_tick, entry.last_task = _ts(row.last_tick_at), row.last_task_id
            entry.queued = [at.timestamp() for at in loaded.queued.get(row.id, [])]
            entry.ticks = loaded.ticks.get(row.id, 0)
            self._add(entry)
            if entry.paused:
                continue
            if entry.next_at is None:
                self._advance(entry, now)
            else:
                self._arm(entry)
            if entry.queued:
                self._waiting.add(entry.id)

    # ---------------------------------------------------------------- changes

    def change(self, item: ChangeSchedule, now: float) -> Reply:
        act = {
            ScheduleAction.CREATE: self._create,
            ScheduleAction.PAUSE: self._pause,
            ScheduleAction.RESUME: self._resume,
            ScheduleAction.DELETE: self._delete,
        }[item.action]
        return act(item, now)

    def _create(self, item: ChangeSchedule, now: float) -> Reply:
        if item.schedule_id in self.entries:
            return OK  # asked again: made already
        d = dict(item.definition or {})
        holder = self._names.get(str(d.get("name")))
        if holder is not None:
            detail = f"a schedule named '{d.get('name')}' exists ({holder}); delete it first or choose another name"
            return {"ok": False, "code": "conflict", "detail": detail, "schedule_id": holder}
        try:
            entry = entry_from(item.schedule_id, d, now)
        except (crons.CronError, ValueError, KeyError, TypeError) as exc:
            return {"ok": False, "code": "validation_error", "detail": f"the schedule cannot be used: {exc}"}
        entry.paused = bool(d.get("paused"))
        if not entry.paused:
            entry.next_at = entry.cron.after(now)
        self.writer.insert(
            Schedule,
            {
                "id": entry.id,
                "name": entry.name,
                "cron": entry.cron.expression,
                "timezone": entry.cron.timezone,
                "task": d["task"],
                "overlap": entry.overlap.value,
                "starting_deadline_s": entry.deadline_s,
                "max_queued": entry.max_queued,
                "paused": entry.paused,
                "paused_at": utc(now) if entry.paused else None,
                "created_at": utc(float(d.get("created") or now)),
                "next_at": _dt(entry.next_at),
                "last_tick_at": None,
                "last_task_id": None,
                "last_run_at": None,
            },
        )
        self._add(entry)
        self._arm(entry)
        log.info("schedule %s (%s) created: %s in %s", entry.name, entry.id, entry.cron.expression, entry.cron.timezone)
        return OK

    def _pause(self, item: ChangeSchedule, now: float) -> Reply:
        entry = self.entries.get(item.schedule_id)
        if entry is None:
            return self._gone(item.schedule_id)
        if entry.paused:
            return OK
        entry.paused, entry.next_at = True, None
        for at in entry.queued:  # paused: nothing of it starts any more
            self._record(
                entry, at, TickOutcome.SKIPPED, None, "the schedule was paused before it could start", now, True
            )
        entry.queued.clear()
        self._waiting.discard(entry.id)
        self.writer.update(Schedule, (entry.id,), paused=True, paused_at=utc(now), next_at=None)
        return OK

    def _resume(self, item: ChangeSchedule, now: float) -> Reply:
        entry = self.entries.get(item.schedule_id)
        if entry is None:
            return self._gone(item.schedule_id)
        if not entry.paused:
            return OK
        entry.paused = False
        self.writer.update(Schedule, (entry.id,), paused=False, paused_at=None)
        self._advance(entry, now)  # the next future tick: the paused time is not caught up
        return OK

    def _delete(self, item: ChangeSchedule, now: float) -> Reply:
        entry = self.entries.pop(item.schedule_id, None)
        if entry is None and self._broken.pop(item.schedule_id, None) is not None:
            self._names = {name: i for name, i in self._names.items() if i != item.schedule_id}
            self.writer.delete(Schedule, (item.schedule_id,))
            return OK
        if entry is None:
            return {"ok": True, "existed": False}
        self._names.pop(entry.name, None)
        self._waiting.discard(entry.id)
        self._prune.discard(entry.id)
        self.writer.delete(Schedule, (entry.id,))  # its ticks go with it (ON DELETE CASCADE); its tasks stay
        log.info("schedule %s (%s) deleted", entry.name, entry.id)
        return OK

    def _gone(self, schedule_id: str) -> Reply:
        if schedule_id in self._broken:
            return {"ok": False, "code": "validation_error", "detail": self._broken[schedule_id]}
        return {"ok": False, "code": "not_found", "detail": f"no schedule '{schedule_id}' (it was deleted)"}

    # ---------------------------------------------------------------- every step

    def due(self, now: float) -> bool:
        """Whether `fire` has anything to do now (the step skips it otherwise)."""
        return bool(self._waiting or self._prune or (self._due and self._due[0][0] <= now))

    async def fire(self, now: float) -> None:
        """Start queued ticks whose previous task ended, then act on every tick that is due."""
        self._started.clear()
        for schedule_id in sorted(self._waiting):
            entry = self.entries.get(schedule_id)
            if entry is None or not entry.queued:
                self._waiting.discard(schedule_id)
                continue
            if not self._busy(entry):
                at = entry.queued.pop(0)
                if not entry.queued:
                    self._waiting.discard(schedule_id)
                await self._start(entry, at, now, queued=True)
        while self._due and self._due[0][0] <= now:
            at, schedule_id = heapq.heappop(self._due)
            found = self.entries.get(schedule_id)
            if found is not None and not found.paused and found.next_at == at:
                await self._tick(found, now)
        if self._prune:
            await self._prune_ticks()

    async def _tick(self, entry: ScheduleRun, now: float) -> None:
        first = entry.next_at
        if first is not None and entry.last_tick is not None and first <= entry.last_tick:
            log.error("schedule %s: its next tick was not after its last recorded one; moving on", entry.id)
            first = await self.compute(entry.cron.after, entry.last_tick)  # a tick is recorded once
        if first is None or first > now:
            await self.compute(entry.cron.after, max(now, entry.last_tick or now))  # remembered for `_advance`
            self._advance(entry, now)
            return
        due = await self.compute(_reckon, entry.cron, first, now, entry.deadline_s, entry.last_tick)
        if due.unlisted_from is not None:
            more = "+" if due.more else ""
            until = f" before {iso(due.missed[0])}" if due.missed else ""
            detail = f"missed, with {due.unlisted - 1}{more} later ticks{until}: {NO_ENGINE}"
            self._record(entry, due.unlisted_from, TickOutcome.MISSED, None, detail, now)
        for at in due.missed:
            if due.run is None and at == due.missed[-1]:
                detail = (
                    f"missed: the engine came back {now - at:.0f}s after this tick, later than the schedule's "
                    f"starting_deadline_s ({entry.deadline_s:g}s)"
                )
            else:
                detail = f"missed: {NO_ENGINE} at this time; only the most recent missed tick may still run"
            self._record(entry, at, TickOutcome.MISSED, None, detail, now)
        if due.run is not None:
            await self._due_tick(entry, due.run, now)
        self._advance(entry, now)

    async def _due_tick(self, entry: ScheduleRun, at: float, now: float) -> None:
        outcome = on_due(entry.overlap, self._busy(entry), len(entry.queued), entry.max_queued)
        if outcome is TickOutcome.CREATED:
            await self._start(entry, at, now)
        elif outcome is TickOutcome.QUEUED:
            entry.queued.append(at)
            self._waiting.add(entry.id)
            self._record(entry, at, outcome, None, f"task {entry.last_task} was still running (overlap: queue)", now)
        elif entry.overlap is Overlap.SKIP:
            self._record(entry, at, outcome, None, f"task {entry.last_task} was still running (overlap: skip)", now)
        else:
            waiting = len(entry.queued)
            detail = f"task {entry.last_task} was still running and {waiting} ticks were waiting already (max_queued)"
            self._record(entry, at, outcome, None, detail, now)

    async def _start(self, entry: ScheduleRun, at: float, now: float, queued: bool = False) -> None:
        """Make the tick's task (through the intake, idempotent on the tick) and record it."""
        if entry.task.needs_llm and self.llm.planner is None:
            detail = (
                "planner_unavailable: this task needs an LLM (a request, or agent nodes) and this server has "
                "none configured (ORRERY_LLM_BASE_URL, ORRERY_LLM_MODEL)"
            )
            self._record(entry, at, TickOutcome.FAILED, None, detail, now, queued)
            return
        previous = entry.last_task
        sub = Submission(
            task_id=self.ids("task"),
            name=entry.task.name or entry.name,
            body_hash=None,
            created=now,
            spec=entry.task.spec,
            request=entry.task.request,
            priority=entry.task.priority,
            labels={**entry.task.labels, SCHEDULE_LABEL: entry.id, TICK_LABEL: iso(at)},
            replan=entry.task.replan,
            idempotency_key=tick_key(entry.id, at),
        )
        answer = await self.start(sub, now)
        task_id = answer["task_id"]
        self._started.add(task_id)
        entry.last_task = task_id
        self.writer.update(Schedule, (entry.id,), last_task_id=task_id, last_run_at=utc(at))
        if task_id != sub.task_id:
            detail = "its task was made before (found by the tick's Idempotency-Key after a restart)"
        elif queued:
            detail = f"queued behind task {previous}; started when it ended, {now - at:.0f}s after the tick"
        elif now - at > LATE_NOTE_S:
            detail = f"started {now - at:.0f}s late: {NO_ENGINE} at its time"
        else:
            detail = ""
        self._record(entry, at, TickOutcome.CREATED, task_id, detail, now, queued)

    def _busy(self, entry: ScheduleRun) -> bool:
        """Whether the schedule's previous task is still running (or was made in this step)."""
        task = entry.last_task
        if task is None:
            return False
        run = self.tasks.get(task)
        return task in self._started or (run is not None and not run.terminal) or task in self.llm.planning

    # ---------------------------------------------------------------- records

    def _record(
        self,
        entry: ScheduleRun,
        at: float,
        outcome: TickOutcome,
        task_id: str | None,
        detail: str,
        now: float,
        update: bool = False,
    ) -> None:
        """A tick's outcome, in this step's writes: a new record, or (`update`) a queued one decided."""
        values = {"outcome": outcome.value, "task_id": task_id, "detail": detail[:2000], "recorded_at": utc(now)}
        self.metrics.schedule_ticks.labels(outcome.value).inc()
        if update:
            self.writer.update(ScheduleTick, (entry.id, utc(at)), **values)
        else:
            self.writer.insert(ScheduleTick, {"schedule_id": entry.id, "at": utc(at), **values})
            entry.ticks += 1
            if entry.ticks > self.settings.schedule_ticks_kept + PRUNE_SLACK:
                self._prune.add(entry.id)
        if entry.last_tick is None or at > entry.last_tick:
            entry.last_tick = at
            self.writer.update(Schedule, (entry.id,), last_tick_at=utc(at))

    def _advance(self, entry: ScheduleRun, now: float) -> None:
        """On to the first tick after `now` and after every tick recorded (so none is fired twice,
        even by a leader whose clock is behind the last one's)."""
        entry.next_at = entry.cron.after(max(now, entry.last_tick or now))
        self.writer.update(Schedule, (entry.id,), next_at=_dt(entry.next_at))
        self._arm(entry)

    def _arm(self, entry: ScheduleRun) -> None:
        if entry.next_at is not None:
            heapq.heappush(self._due, (entry.next_at, entry.id))
            self.timers.add(entry.next_at, Wake())

    def _add(self, entry: ScheduleRun) -> None:
        self.entries[entry.id] = entry
        self._names[entry.name] = entry.id

    async def _prune_ticks(self) -> None:
        keep = self.settings.schedule_ticks_kept
        for schedule_id in sorted(self._prune):
            try:
                removed = await self.prune_rows(self.store, schedule_id, keep)
            except Exception as exc:  # the history is only longer for a while: the next step tries again
                log.warning("could not prune the ticks of schedule %s: %s", schedule_id, exc)
                return
            self._prune.discard(schedule_id)
            entry = self.entries.get(schedule_id)
            if entry is not None:
                entry.ticks = max(0, entry.ticks - removed)


def _reckon(cron: Cron, first: float, now: float, deadline_s: float, last_tick: float | None) -> Backlog:
    """The ticks due from `first` up to `now`; and the tick `_advance` asks for after them (the
    ones recorded are all at most `now`), found here so the cron remembers it (`domain.cron._after`)."""
    due = backlog(cron, first, now, deadline_s)
    cron.after(max(now, last_tick or now))
    return due


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _dt(value: float | None) -> datetime | None:
    return utc(value) if value is not None else None
