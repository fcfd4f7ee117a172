"""Schedules in the store: what the engine reloads at a start, what the API shows.

Only the engine leader writes schedules and their ticks, through its step writer (a tick's task,
its record and the schedule's next tick are one commit). Everything here reads, except
`prune_ticks`, which the engine calls to keep each schedule's history bounded.
"""

from __future__ import annotations

import base64
import binascii
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import delete, func, select

from orchestrator.store.models import Schedule, ScheduleTick, Task
from orchestrator.store.repo import MAX_CANDIDATES, MIN_PREFIX, BadCursor, Store, id_prefix
from orchestrator.store.sqlite_writer import sqlite_datetime

QUEUED = "queued"


@dataclass
class Loaded:
    """Every schedule, with its queued ticks (oldest first) and how many ticks it has recorded."""

    schedules: list[Schedule]
    queued: dict[str, list[datetime]] = field(default_factory=dict)
    ticks: dict[str, int] = field(default_factory=dict)


async def load(store: Store) -> Loaded:
    """What the engine needs of the schedules after a (re)start or a failover."""
    async with store.sessions() as s:
        rows = list((await s.execute(select(Schedule).order_by(Schedule.name))).scalars())
        q = select(ScheduleTick.schedule_id, ScheduleTick.at).where(ScheduleTick.outcome == QUEUED)
        queued: dict[str, list[datetime]] = defaultdict(list)
        for schedule_id, at in (await s.execute(q.order_by(ScheduleTick.schedule_id, ScheduleTick.at))).all():
            queued[str(schedule_id)].append(at)
        counts = select(ScheduleTick.schedule_id, func.count()).group_by(ScheduleTick.schedule_id)
        ticks = {str(i): int(n) for i, n in (await s.execute(counts)).all()}
    return Loaded(rows, dict(queued), ticks)


async def get(store: Store, schedule_id: str) -> Schedule | None:
    async with store.sessions() as s:
        return await s.get(Schedule, schedule_id)


async def resolve(store: Store, ref: str) -> tuple[Schedule | None, list[Schedule]]:
    """The schedule `ref` names: its id, its name or a unique id prefix of at least `MIN_PREFIX`
    characters; (None, candidates) when the prefix is ambiguous, (None, []) when nothing matches."""
    async with store.sessions() as s:
        row = await s.get(Schedule, ref)
        if row is None:
            row = await s.scalar(select(Schedule).where(Schedule.name == ref))
        if row is not None:
            return row, []
        if len(ref) < MIN_PREFIX:
            return None, []
        q = select(Schedule).where(id_prefix(Schedule.id, ref, "sch")).order_by(Schedule.id).limit(MAX_CANDIDATES)
        rows = list((await s.execute(q)).scalars())
    return (rows[0], []) if len(rows) == 1 else (None, rows)


async def by_name(store: Store, name: str) -> Schedule | None:
    async with store.sessions() as s:
        return await s.scalar(select(Schedule).where(Schedule.name == name))


async def page(store: Store, limit: int, cursor: str | None) -> tuple[list[Schedule], str | None]:
    """Schedules by name, keyset-paginated on the name."""
    q = select(Schedule).order_by(Schedule.name).limit(limit + 1)
    if cursor:
        q = q.where(Schedule.name > _decode(cursor))
    async with store.sessions() as s:
        rows = list((await s.execute(q)).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, _encode(rows[-1].name) if more and rows else None


async def ticks(
    store: Store, schedule_id: str, limit: int, cursor: str | None, outcome: str | None = None
) -> tuple[list[ScheduleTick], str | None]:
    """A schedule's ticks, newest first, keyset-paginated on the tick's time."""
    q = select(ScheduleTick).where(ScheduleTick.schedule_id == schedule_id)
    if outcome:
        q = q.where(ScheduleTick.outcome == outcome)
    if cursor:
        try:
            before = datetime.fromisoformat(_decode(cursor))
        except ValueError:
            raise BadCursor("the cursor is not one this server issued; start again without it") from None
        q = q.where(ScheduleTick.at < before)
    async with store.sessions() as s:
        rows = list((await s.execute(q.order_by(ScheduleTick.at.desc()).limit(limit + 1))).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, _encode(rows[-1].at.isoformat()) if more and rows else None


async def queued(store: Store, schedule_ids: list[str]) -> dict[str, list[datetime]]:
    """Each schedule's ticks waiting for its previous task, oldest first."""
    if not schedule_ids:
        return {}
    q = (
        select(ScheduleTick.schedule_id, ScheduleTick.at)
        .where(ScheduleTick.outcome == QUEUED, ScheduleTick.schedule_id.in_(schedule_ids))
        .order_by(ScheduleTick.at)
    )
    out: dict[str, list[datetime]] = defaultdict(list)
    async with store.sessions() as s:
        for schedule_id, at in (await s.execute(q)).all():
            out[str(schedule_id)].append(at)
    return dict(out)


async def tasks(store: Store, task_ids: list[str]) -> dict[str, tuple[str, str]]:
    """task id -> (name, state) of the tasks named (a schedule's last run, its ticks' tasks)."""
    if not task_ids:
        return {}
    async with store.sessions() as s:
        rows = (await s.execute(select(Task.id, Task.name, Task.state).where(Task.id.in_(task_ids)))).all()
    return {str(i): (str(n), str(st)) for i, n, st in rows}


async def prune_ticks(store: Store, schedule_id: str, keep: int) -> int:
    """Delete all but the newest `keep` ticks of a schedule (queued ones always stay); how many went."""
    async with store.sessions() as s:
        q = select(ScheduleTick.at).where(ScheduleTick.schedule_id == schedule_id).order_by(ScheduleTick.at.desc())
        oldest_kept = await s.scalar(q.offset(keep - 1).limit(1))
    if oldest_kept is None:
        return 0
    writer = store.sqlite
    if writer is not None:
        sql = "DELETE FROM schedule_ticks WHERE schedule_id = ? AND at < ? AND outcome != ? RETURNING at"
        return len(writer.execute(sql, (schedule_id, sqlite_datetime(oldest_kept), QUEUED)))
    async with store.engine.begin() as conn:
        result = await conn.execute(
            delete(ScheduleTick).where(
                ScheduleTick.schedule_id == schedule_id,
                ScheduleTick.at < oldest_kept,
                ScheduleTick.outcome != QUEUED,
            )
        )
        return int(result.rowcount or 0)


def _encode(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode().rstrip("=")


def _decode(cursor: str) -> str:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, ValueError):
        raise BadCursor("the cursor is not one this server issued; start again without it") from None
    if "\x00" in text:  # Postgres cannot compare it; no name contains one
        raise BadCursor("the cursor is not one this server issued; start again without it")
    return text
