"""What a schedule does with its ticks: the pure rules, applied by `engine/schedules.py`.

A tick is one instant the schedule's cron expression names. The engine leader fires each tick in
one of its steps, and every tick ends as exactly one recorded outcome:

- `created`: the tick's task was made (in the same commit that records the tick);
- `queued`: overlap `queue`, and the schedule's previous task is still running: the tick waits
  (at most `max_queued` of them, oldest first) and becomes `created` once that task ends;
- `skipped`: overlap `skip` and the previous task still runs, or the queue was full, or the
  schedule was paused or deleted before a queued tick could start;
- `missed`: no engine ran at its time (a restart, a failover) and it was not the one to catch up;
- `failed`: its task could not be made (a planned task and no LLM configured any more).

Missed ticks, as Kubernetes CronJob's `startingDeadlineSeconds`: when the engine comes back, of the
ticks it slept through only the most recent one runs, and only if it is at most
`starting_deadline_s` old; every other one is recorded `missed` (the newest `MISSED_LISTED` one by
one, the rest in one entry that counts them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NewType

from orchestrator.domain.cron import Cron
from orchestrator.domain.model import DagSpec, NodeKind

ScheduleId = NewType("ScheduleId", str)

DEFAULT_STARTING_DEADLINE_S = 3600.0
MAX_STARTING_DEADLINE_S = 7 * 86400.0
DEFAULT_MAX_QUEUED = 5
MAX_QUEUED = 100
MISSED_LISTED = 20  # missed ticks recorded one by one after an outage; older ones are counted
COUNT_CAP = 20_000  # missed ticks counted one by one, at most (a week of a per-minute schedule is 10,080)
SCHEDULE_LABEL = "orrery.schedule"  # on each task a schedule makes: the schedule's id
TICK_LABEL = "orrery.tick"  # ...and the tick it was made for (ISO 8601, UTC)


class Overlap(StrEnum):
    """What a tick does while the schedule's previous task is still running."""

    SKIP = "skip"
    QUEUE = "queue"


class TickOutcome(StrEnum):
    CREATED = "created"
    QUEUED = "queued"
    SKIPPED = "skipped"
    MISSED = "missed"
    FAILED = "failed"


@dataclass(frozen=True)
class ScheduledTask:
    """The task body a schedule submits at each tick (`POST /v1/tasks`' fields, checked when the
    schedule was created)."""

    spec: DagSpec | None
    request: str | None = None
    name: str | None = None
    priority: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    replan: bool = False

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ScheduledTask:
        dag = body.get("dag")
        return cls(
            spec=DagSpec.model_validate(dag) if dag is not None else None,
            request=body.get("request"),
            name=body.get("name"),
            priority=int(body.get("priority") or 0),
            labels=dict(body.get("labels") or {}),
            replan=bool(body.get("replan")) or body.get("request") is not None,
        )

    @property
    def needs_llm(self) -> bool:
        """Planned from a request, or with agent nodes: only a server with an LLM can run it."""
        return self.spec is None or any(n.kind is NodeKind.AGENT for n in self.spec.nodes)


@dataclass(frozen=True)
class Backlog:
    """The ticks due when the engine looks (normally one; after an outage, many)."""

    run: float | None  # the tick to act on now: the most recent due one, if within the deadline
    missed: list[float]  # ticks to record `missed` one by one, oldest first (the newest MISSED_LISTED)
    unlisted: int  # further missed ticks, all older than those listed
    unlisted_from: float | None  # the oldest of them (its entry stands for them all)
    more: bool = False  # more than COUNT_CAP ticks were missed: `unlisted` is a lower bound


def backlog(cron: Cron, first_due: float, now: float, deadline_s: float) -> Backlog:
    """What is due from `first_due` (a tick of `cron`, not yet handled) up to `now`."""
    recent, count, more = _ticks(cron, first_due, now)
    if more:
        # Counting stopped at the cap: the tick that may still run is the latest one, found in the
        # shortest recent span that holds any (each read is bounded by the cap too).
        for span in (60.0, 3600.0, 86400.0, deadline_s):
            start = now - min(span, deadline_s)
            first = cron.after(start)
            recent, _, _ = _ticks(cron, first, now) if first is not None else (deque(), 0, False)
            if recent or span >= deadline_s:
                break
    latest = recent[-1] if recent else None
    run = latest if latest is not None and now - latest <= deadline_s else None
    missed = [t for t in recent if t != run][-MISSED_LISTED:]
    unlisted = max(count - len(missed) - (1 if run is not None else 0), 0)
    if more:
        unlisted = max(unlisted, COUNT_CAP - len(missed))
    listed_from = missed[0] if missed else run
    unlisted_from = first_due if unlisted > 0 and first_due != listed_from else None
    return Backlog(run, missed, unlisted if unlisted_from is not None else 0, unlisted_from, more)


def _ticks(cron: Cron, first: float, until: float) -> tuple[deque[float], int, bool]:
    """The newest MISSED_LISTED + 1 ticks from `first` (a tick) up to `until`, how many there
    are (at most COUNT_CAP), and whether there are more than that."""
    recent: deque[float] = deque(maxlen=MISSED_LISTED + 1)
    count = 0
    at: float | None = first
    while at is not None and at <= until and count < COUNT_CAP:
        recent.append(at)
        count += 1
        at = cron.after(at)
    return recent, count, at is not None and at <= until


def on_due(overlap: Overlap, previous_running: bool, queued: int, max_queued: int) -> TickOutcome:
    """What a due tick becomes: its task made now, or queued or skipped behind the previous one."""
    if not previous_running and queued == 0:
        return TickOutcome.CREATED
    if overlap is Overlap.SKIP:
        return TickOutcome.SKIPPED
    return TickOutcome.QUEUED if queued < max_queued else TickOutcome.SKIPPED


def tick_key(schedule_id: str, at: float) -> str:
    """The Idempotency-Key of the task a tick makes: the intake makes at most one task per key,
    so a tick fired again (after a crash, on another leader) finds its task instead of a second."""
    return f"schedule:{schedule_id}:{int(at)}"
