"""Bodies of `/v1/schedules`, and schedule rows rendered as them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.api.schemas import NO_NUL, TaskCreate, WarningOut
from orchestrator.domain import cron as crons
from orchestrator.domain.schedule import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_STARTING_DEADLINE_S,
    MAX_QUEUED,
    MAX_STARTING_DEADLINE_S,
    Overlap,
    TickOutcome,
)
from orchestrator.store.models import Schedule, ScheduleTick

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class ScheduleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=NAME_PATTERN, description="unique among schedules")
    cron: Annotated[
        str,
        Field(
            min_length=1,
            max_length=200,
            description="five fields `minute hour day-of-month month day-of-week` (Debian cron), a sixth in "
            "front for seconds, or a macro (`@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`)",
        ),
        NO_NUL,
    ]
    timezone: Annotated[
        str, Field(min_length=1, max_length=64, description="IANA time zone the cron fields are read in"), NO_NUL
    ] = "UTC"
    task: TaskCreate = Field(description="the task submitted at each tick: a `POST /v1/tasks` body")
    overlap: Overlap = Field(
        default=Overlap.SKIP,
        description="a tick while the previous task still runs: `skip` it, or `queue` it (at most `max_queued`)",
    )
    paused: bool = False
    starting_deadline_s: float = Field(
        default=DEFAULT_STARTING_DEADLINE_S,
        ge=1,
        le=MAX_STARTING_DEADLINE_S,
        description="after an outage, the most recent missed tick still runs if it is at most this old",
    )
    max_queued: int = Field(default=DEFAULT_MAX_QUEUED, ge=1, le=MAX_QUEUED, description="ticks waiting (`queue`)")


class LastRunOut(BaseModel):
    at: datetime = Field(description="the tick (UTC)")
    local: str = Field(description="the tick in the schedule's time zone, with its offset")
    task_id: str
    task_name: str | None = None
    task_state: str | None = None


class ScheduleOut(BaseModel):
    id: str
    name: str
    cron: str
    timezone: str
    description: str = Field(description="the cron expression in words")
    overlap: Overlap
    paused: bool
    paused_at: datetime | None = None
    starting_deadline_s: float
    max_queued: int
    task: dict[str, Any]
    created_at: datetime
    next_runs: list[str] = Field(description="the next ticks in the schedule's time zone, with their offset")
    queued: list[str] = Field(default_factory=list, description="ticks waiting for the previous task to end")
    last_run: LastRunOut | None = Field(default=None, description="the newest tick that made a task, and that task")
    warnings: list[WarningOut] = Field(default_factory=list)  # set on the answer to a creation


class TickOut(BaseModel):
    at: datetime = Field(description="the tick (UTC)")
    local: str = Field(description="the tick in the schedule's time zone, with its offset")
    outcome: TickOutcome
    task_id: str | None = None
    task_state: str | None = None
    detail: str = ""
    recorded_at: datetime


def cron_of(row: Schedule, now: float) -> crons.Cron | None:
    """The row's cron, or None if it no longer evaluates (its zone left the tz database)."""
    try:
        return crons.parse(row.cron, row.timezone, now)
    except crons.CronError:
        return None


def local(cron: crons.Cron | None, at: datetime) -> str:
    return cron.local(at.timestamp()).isoformat() if cron is not None else at.isoformat()


def schedule_out(
    row: Schedule,
    now: float,
    tasks: dict[str, tuple[str, str]],
    queued: list[datetime],
    next_count: int = 5,
    warnings: list[dict[str, Any]] | None = None,
) -> ScheduleOut:
    """`tasks` maps task ids to (name, state) for the last run; `queued` are its waiting ticks."""
    cron = cron_of(row, now)
    last = None
    if row.last_task_id and row.last_run_at:
        name, state = tasks.get(row.last_task_id, (None, None))
        last = LastRunOut(
            at=row.last_run_at,
            local=local(cron, row.last_run_at),
            task_id=row.last_task_id,
            task_name=name,
            task_state=state,
        )
    upcoming = [] if row.paused or cron is None else [cron.local(t).isoformat() for t in cron.upcoming(now, next_count)]
    return ScheduleOut(
        id=row.id,
        name=row.name,
        cron=row.cron,
        timezone=row.timezone,
        description=cron.explain() if cron is not None else f"cannot be evaluated in time zone {row.timezone}",
        overlap=Overlap(row.overlap),
        paused=bool(row.paused),
        paused_at=row.paused_at,
        starting_deadline_s=row.starting_deadline_s,
        max_queued=row.max_queued,
        task=row.task or {},
        created_at=row.created_at,
        next_runs=upcoming,
        queued=[local(cron, at) for at in queued],
        last_run=last,
        warnings=[WarningOut.model_validate(w) for w in warnings or []],
    )


def tick_out(row: ScheduleTick, cron: crons.Cron | None, tasks: dict[str, tuple[str, str]]) -> TickOut:
    return TickOut(
        at=row.at,
        local=local(cron, row.at),
        outcome=TickOutcome(row.outcome),
        task_id=row.task_id,
        task_state=tasks[row.task_id][1] if row.task_id in tasks else None,
        detail=row.detail or "",
        recorded_at=row.recorded_at,
    )
