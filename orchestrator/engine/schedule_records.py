"""A schedule as the engine holds it, and the changes operators ask of it: plain data,
shared by the engine's schedule book, the API that asks and the wire between replicas."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from orchestrator.domain import cron as crons
from orchestrator.domain.schedule import Overlap, ScheduledTask
from orchestrator.engine.records import Input
from orchestrator.store.models import Schedule

Reply = dict[str, Any]  # {"ok": True} or {"ok": False, "code": ..., "detail": ...}: portable across replicas
OK: Reply = {"ok": True}


class ScheduleAction(StrEnum):
    CREATE = "create"
    PAUSE = "pause"
    RESUME = "resume"
    DELETE = "delete"


@dataclass
class ChangeSchedule(Input):
    """A change an operator asked for; the reply is a `Reply`. Asked again (a lost answer between
    replicas) it changes nothing more: creating the same id, pausing a paused schedule, deleting
    one that is gone all answer as the first time did."""

    action: ScheduleAction
    schedule_id: str
    definition: dict[str, Any] | None = None  # CREATE: the schedule's fields, as the API checked them

    def as_json(self) -> dict[str, Any]:
        return {"action": self.action.value, "schedule_id": self.schedule_id, "definition": self.definition}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChangeSchedule:
        return cls(ScheduleAction(data["action"]), str(data["schedule_id"]), data.get("definition"))


@dataclass
class ScheduleRun:
    """A schedule as the engine keeps it."""

    id: str
    name: str
    cron: crons.Cron
    task: ScheduledTask
    overlap: Overlap
    deadline_s: float
    max_queued: int
    paused: bool = False
    next_at: float | None = None  # the next tick to fire (None while paused, or when it never fires again)
    last_tick: float | None = None  # the newest tick recorded: a tick is recorded once, in time order
    last_task: str | None = None  # the task its newest started tick made
    queued: list[float] = field(default_factory=list)  # ticks waiting for that task, oldest first
    ticks: int = 0  # tick records in the store (pruned past `schedule_ticks_kept`)


def entry_from(schedule_id: str, d: dict[str, Any], now: float) -> ScheduleRun:
    """A schedule from its stored fields (checked again: a zone can vanish from the tz database)."""
    return ScheduleRun(
        id=schedule_id,
        name=str(d["name"]),
        cron=crons.parse(str(d["cron"]), str(d["timezone"]), now),
        task=ScheduledTask.from_body(d["task"]),
        overlap=Overlap(d["overlap"]),
        deadline_s=float(d["starting_deadline_s"]),
        max_queued=int(d["max_queued"]),
    )


def definition_of(row: Schedule) -> dict[str, Any]:
    return {
        "name": row.name,
        "cron": row.cron,
        "timezone": row.timezone,
        "task": row.task,
        "overlap": row.overlap,
        "starting_deadline_s": row.starting_deadline_s,
        "max_queued": row.max_queued,
    }
