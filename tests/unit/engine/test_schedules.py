"""Schedules in the engine (issue 20), step by step on the virtual clock: one task per tick, made
in the commit that records the tick, whatever crashes, restarts, outages, overlaps and pauses
come in between. What the store holds afterwards is what a restart (or the next leader) sees."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.cluster import wire
from orchestrator.domain.schedule import SCHEDULE_LABEL, TICK_LABEL, tick_key
from orchestrator.engine.records import CancelTask
from orchestrator.engine.schedule_records import ChangeSchedule, ScheduleAction
from orchestrator.engine.times import iso
from orchestrator.store import schedules as stored
from orchestrator.store.models import Schedule, ScheduleTick, Task
from orchestrator.store.repo import ChangeSet
from tests.unit.engine.harness import T0, Harness, accepted, one_node, results

MINUTE = 60.0
# Devices here never fall silent for liveness (tests/unit/engine/test_guarantees.py covers that):
# hours of virtual time pass in a few steps.
QUIET = {"heartbeat_interval_s": 1e5, "heartbeat_timeout_s": 1e6}


async def harness_in(tmp_path: Path, **settings: Any) -> Harness:
    """A harness (built on a thread: it migrates its database with Alembic's own event loop)."""
    return await asyncio.to_thread(lambda: Harness(tmp_path, **{**QUIET, **settings}))


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = await (await harness_in(tmp_path)).open()
    try:
        yield harness
    finally:
        await harness.close()


LONG = one_node(timeout_s=86400)  # runs until the test reports its results


def definition(name: str = "nightly", cron: str = "* * * * *", **fields: Any) -> dict[str, Any]:
    task = fields.pop("task", {"dag": LONG})
    return {
        "name": name,
        "cron": cron,
        "timezone": fields.pop("timezone", "UTC"),
        "task": task,
        "overlap": fields.pop("overlap", "skip"),
        "paused": fields.pop("paused", False),
        "starting_deadline_s": fields.pop("starting_deadline_s", 3600.0),
        "max_queued": fields.pop("max_queued", 5),
        "created": T0,
        **fields,
    }


async def create(h: Harness, schedule_id: str = "sch_1", **fields: Any) -> dict[str, Any]:
    (reply,) = await h.step(ChangeSchedule(ScheduleAction.CREATE, schedule_id, definition(**fields)))
    assert isinstance(reply, dict)
    return reply


async def act(h: Harness, action: ScheduleAction, schedule_id: str = "sch_1") -> dict[str, Any]:
    (reply,) = await h.step(ChangeSchedule(action, schedule_id))
    assert isinstance(reply, dict)
    return reply


async def tasks_of(h: Harness, schedule_id: str = "sch_1") -> list[Task]:
    """The tasks the schedule made, in the order of their ticks."""
    async with h.store.sessions() as s:
        rows = (await s.execute(select(Task))).scalars()
        made = [t for t in rows if (t.labels or {}).get(SCHEDULE_LABEL) == schedule_id]
    return sorted(made, key=lambda t: t.labels[TICK_LABEL])


async def ticks(h: Harness, schedule_id: str = "sch_1") -> list[tuple[float, str, str | None]]:
    """(tick, outcome, task id), oldest first."""
    rows, _ = await stored.ticks(h.store, schedule_id, 10_000, None)
    return [(r.at.timestamp(), r.outcome, r.task_id) for r in reversed(rows)]


async def row(h: Harness, schedule_id: str = "sch_1") -> Schedule:
    found = await stored.get(h.store, schedule_id)
    assert found is not None
    return found


async def device(h: Harness, name: str = "worker") -> str:
    dev = await h.enroll(name)
    await h.connect(dev)
    return dev


async def accept(h: Harness, dev: str) -> None:
    """The device takes the batch it was given last (and runs it until `finish`)."""
    await h.step(accepted(dev, h.batches(dev)[-1]))


async def finish(h: Harness, dev: str) -> None:
    """The device runs the batch it was given last and reports success."""
    batch = h.batches(dev)[-1]
    await h.step(accepted(dev, batch), results(dev, batch))


# ---------------------------------------------------------------- one task per tick


async def test_each_tick_makes_one_task_in_the_commit_that_records_it(h: Harness) -> None:
    dev = await device(h)
    assert await create(h) == {"ok": True}
    assert (await row(h)).next_at == datetime.fromtimestamp(T0 + MINUTE, UTC)
    await h.advance(MINUTE - 1)
    assert await tasks_of(h) == []  # not before its time
    await h.advance(1)
    (first,) = await tasks_of(h)
    assert first.idempotency_key == tick_key("sch_1", T0 + MINUTE)
    assert first.name == "nightly" and first.labels == {SCHEDULE_LABEL: "sch_1", TICK_LABEL: iso(T0 + MINUTE)}
    assert [b.task_id for b in h.batches(dev)] == [first.id]  # started at once, like any submission
    assert await ticks(h) == [(T0 + MINUTE, "created", first.id)]
    stored_row = await row(h)
    assert (stored_row.last_task_id, stored_row.next_at) == (first.id, datetime.fromtimestamp(T0 + 2 * MINUTE, UTC))
    await finish(h, dev)
    await h.advance(MINUTE)
    second = (await tasks_of(h))[-1]
    assert second.id != first.id
    assert [t for _, t, _ in await ticks(h)] == ["created", "created"]
    assert h.engine.metrics.registry.get_sample_value("orrery_schedule_ticks_total", {"outcome": "created"}) == 2


async def test_a_tick_committed_before_a_restart_is_never_fired_again(h: Harness) -> None:
    dev = await device(h)
    await create(h)
    await h.advance(MINUTE)
    assert len(await tasks_of(h)) == 1
    await finish(h, dev)
    await h.restart()  # kill -9 and a new engine (or the next leader) on the same store
    await h.advance(1)
    assert len(await tasks_of(h)) == 1
    await h.advance(MINUTE)
    assert len(await tasks_of(h)) == 2
    assert [at for at, _, _ in await ticks(h)] == [T0 + MINUTE, T0 + 2 * MINUTE]


async def test_a_crash_before_the_tick_is_committed_makes_its_task_once_after_the_restart(h: Harness) -> None:
    await create(h)
    real_write = h.store.write

    async def refused(changes: ChangeSet) -> list[int]:
        raise OSError("injected: the disk went away during the tick's commit")

    h.store.write = refused  # type: ignore[method-assign]
    with pytest.raises(OSError):
        await h.advance(MINUTE)  # the step made the task and the record, and could not commit them
    h.store.write = real_write  # type: ignore[method-assign]
    assert await tasks_of(h) == [] and await ticks(h) == []  # nothing of that step is in the store
    await h.restart()
    await h.advance(0)
    (task,) = await tasks_of(h)
    assert await ticks(h) == [(T0 + MINUTE, "created", task.id)]
    await h.restart()
    await h.advance(1)
    assert len(await tasks_of(h)) == 1


async def test_a_task_found_for_a_tick_whose_record_was_lost_is_not_made_twice(h: Harness) -> None:
    """A crash between the task's creation and the tick's record, as a store that wrote one and
    not the other would leave it: the tick's task exists, the schedule still waits for the tick."""
    await create(h)
    made = await h.submit(one_node(), notify=False)
    await h.store.update(Task, (made,), idempotency_key=tick_key("sch_1", T0 + MINUTE))
    await h.restart()
    await h.advance(MINUTE)
    assert [t.id for t in await tasks_of(h)] == []  # no task with the schedule's labels was made
    ((at, outcome, task_id),) = await ticks(h)
    assert (at, outcome, task_id) == (T0 + MINUTE, "created", made)
    async with h.store.sessions() as s:
        assert (await s.scalar(select(ScheduleTick.detail))) == (
            "its task was made before (found by the tick's Idempotency-Key after a restart)"
        )
        assert len(list((await s.execute(select(Task))).scalars())) == 1


async def test_a_leader_whose_clock_is_behind_never_fires_a_recorded_tick_again(h: Harness) -> None:
    await create(h)
    await h.advance(MINUTE)
    await h.restart()
    h.clock.now -= 3 * MINUTE  # the next leader's clock is behind the last one's
    await h.advance(MINUTE)
    await h.advance(MINUTE)
    assert len(await tasks_of(h)) == 1
    await h.advance(2 * MINUTE)
    assert [at for at, _, _ in await ticks(h)] == [T0 + MINUTE, T0 + 2 * MINUTE]


# ---------------------------------------------------------------- overlap


async def test_overlap_skip_records_ticks_skipped_while_the_previous_task_runs(h: Harness) -> None:
    dev = await device(h)
    await create(h, overlap="skip")
    await h.advance(MINUTE)
    await accept(h, dev)
    await h.advance(MINUTE)
    await h.advance(MINUTE)
    (running,) = await tasks_of(h)
    assert [(o, t) for _, o, t in await ticks(h)] == [("created", running.id), ("skipped", None), ("skipped", None)]
    await finish(h, dev)
    await h.advance(MINUTE)
    assert len(await tasks_of(h)) == 2


async def test_overlap_queue_starts_a_waiting_tick_when_the_previous_task_ends(h: Harness) -> None:
    dev = await device(h)
    await create(h, overlap="queue", max_queued=2)
    await h.advance(MINUTE)
    await accept(h, dev)
    for _ in range(3):
        await h.advance(MINUTE)
    (first,) = await tasks_of(h)
    assert [o for _, o, _ in await ticks(h)] == ["created", "queued", "queued", "skipped"]  # the queue holds 2
    assert [at.timestamp() for at in (await stored.queued(h.store, ["sch_1"]))["sch_1"]] == [
        T0 + 2 * MINUTE,
        T0 + 3 * MINUTE,
    ]
    await finish(h, dev)  # the first task ends: the oldest waiting tick starts in the same step
    first_done, second = await tasks_of(h)
    assert first_done.id == first.id and first_done.state == "succeeded" and second.state == "running"
    assert second.labels[TICK_LABEL] == iso(T0 + 2 * MINUTE)
    assert (await ticks(h))[1] == (T0 + 2 * MINUTE, "created", second.id)
    await finish(h, dev)
    third = (await tasks_of(h))[-1]
    assert third.labels[TICK_LABEL] == iso(T0 + 3 * MINUTE)
    assert [o for _, o, _ in await ticks(h)] == ["created", "created", "created", "skipped"]
    assert await stored.queued(h.store, ["sch_1"]) == {}


async def test_queued_ticks_survive_a_restart_and_start_after_the_previous_task(h: Harness) -> None:
    dev = await device(h)
    await create(h, overlap="queue")
    await h.advance(MINUTE)
    await accept(h, dev)
    await h.advance(MINUTE)
    assert [o for _, o, _ in await ticks(h)] == ["created", "queued"]
    await h.restart()
    _, epoch = await h.connect(dev)
    assert epoch > 0
    await h.advance(1)
    assert len(await tasks_of(h)) == 1  # still waiting: the first task has not ended
    await finish(h, dev)
    assert len(await tasks_of(h)) == 2
    assert [o for _, o, _ in await ticks(h)] == ["created", "created"]


# ---------------------------------------------------------------- pause, resume, delete


async def test_a_paused_schedule_fires_nothing_and_resumes_at_the_next_future_tick(h: Harness) -> None:
    dev = await device(h)
    await create(h)
    await h.advance(MINUTE)
    await finish(h, dev)
    assert await act(h, ScheduleAction.PAUSE) == {"ok": True}
    assert await act(h, ScheduleAction.PAUSE) == {"ok": True}  # asked again: nothing more happens
    paused = await row(h)
    assert paused.paused and paused.next_at is None and paused.paused_at is not None
    for _ in range(5):
        await h.advance(MINUTE)
    assert len(await tasks_of(h)) == 1
    await h.restart()  # paused survives a restart
    await h.advance(MINUTE)
    assert len(await tasks_of(h)) == 1
    h.clock.now += 25  # resumed mid-minute: the paused time is not caught up
    assert await act(h, ScheduleAction.RESUME) == {"ok": True}
    resumed = await row(h)
    assert not resumed.paused and resumed.next_at == datetime.fromtimestamp(T0 + 8 * MINUTE, UTC)
    await h.advance(MINUTE - 25)
    assert len(await tasks_of(h)) == 2
    assert [at for at, _, _ in await ticks(h)] == [T0 + MINUTE, T0 + 8 * MINUTE]


async def test_pausing_drops_the_queued_ticks(h: Harness) -> None:
    dev = await device(h)
    await create(h, overlap="queue")
    await h.advance(MINUTE)
    await accept(h, dev)
    await h.advance(MINUTE)
    await act(h, ScheduleAction.PAUSE)
    assert [o for _, o, _ in await ticks(h)] == ["created", "skipped"]
    await finish(h, dev)
    assert len(await tasks_of(h)) == 1


async def test_deleting_a_schedule_keeps_its_tasks_and_ends_its_ticks(h: Harness) -> None:
    await create(h)
    await h.advance(MINUTE)
    assert await act(h, ScheduleAction.DELETE) == {"ok": True}
    assert await act(h, ScheduleAction.DELETE) == {"ok": True, "existed": False}  # asked again
    assert await stored.get(h.store, "sch_1") is None
    assert await ticks(h) == []  # its history went with it
    for _ in range(3):
        await h.advance(MINUTE)
    assert len(await tasks_of(h)) == 1  # the task it made stays
    assert (await act(h, ScheduleAction.PAUSE))["code"] == "not_found"


async def test_names_are_unique_and_creating_the_same_schedule_again_is_answered_alike(h: Harness) -> None:
    assert await create(h, "sch_1") == {"ok": True}
    assert await create(h, "sch_1") == {"ok": True}  # a retry after a lost answer
    taken = await create(h, "sch_2")
    assert taken["ok"] is False and taken["code"] == "conflict" and taken["schedule_id"] == "sch_1"
    await act(h, ScheduleAction.DELETE, "sch_1")
    assert await create(h, "sch_2") == {"ok": True}  # the name is free again


# ---------------------------------------------------------------- missed ticks


async def test_after_an_outage_the_most_recent_missed_tick_runs_once_and_the_others_are_missed(h: Harness) -> None:
    dev = await device(h)
    await create(h, starting_deadline_s=300.0)
    await h.advance(MINUTE)
    await finish(h, dev)
    h.clock.now += 10 * MINUTE + 20  # the engine is down for ten minutes
    await h.restart()
    await h.advance(0)
    _, caught_up = await tasks_of(h)
    recorded = await ticks(h)
    assert [at for at, _, _ in recorded] == [T0 + n * MINUTE for n in range(1, 12)]
    assert [o for _, o, _ in recorded] == ["created"] + ["missed"] * 9 + ["created"]
    assert recorded[-1][2] == caught_up.id and caught_up.labels[TICK_LABEL] == iso(T0 + 11 * MINUTE)
    assert (await row(h)).next_at == datetime.fromtimestamp(T0 + 12 * MINUTE, UTC)
    await h.advance(1)
    assert len(await tasks_of(h)) == 2


async def test_a_missed_tick_older_than_the_starting_deadline_does_not_run(h: Harness) -> None:
    await create(h, starting_deadline_s=30.0)
    h.clock.now += 3 * MINUTE + 45  # down over three ticks; the last one is 45 s old
    await h.restart()
    await h.advance(0)
    assert await tasks_of(h) == []
    recorded = await ticks(h)
    assert [o for _, o, _ in recorded] == ["missed"] * 3
    async with h.store.sessions() as s:
        last = await s.scalar(select(ScheduleTick.detail).order_by(ScheduleTick.at.desc()))
    assert last is not None and "starting_deadline_s (30s)" in last and "45s after" in last


async def test_a_long_outage_lists_the_newest_missed_ticks_and_counts_the_rest(h: Harness) -> None:
    await create(h)
    h.clock.now += 30 * MINUTE
    await h.restart()
    await h.advance(0)
    recorded = await ticks(h)
    assert [o for _, o, _ in recorded] == ["missed"] * 21 + ["created"]
    assert recorded[0][0] == T0 + MINUTE  # one entry for the nine oldest, then the newest 20 one by one
    assert recorded[1][0] == T0 + 10 * MINUTE
    async with h.store.sessions() as s:
        oldest = await s.scalar(select(ScheduleTick.detail).order_by(ScheduleTick.at))
    assert oldest is not None and oldest.startswith("missed, with 8 later ticks before")


# ---------------------------------------------------------------- planned tasks, time zones, history


async def test_a_planned_task_without_a_planner_records_its_tick_failed(h: Harness) -> None:
    await create(h, task={"request": "count the 500s in the web logs"})
    await h.advance(MINUTE)
    ((_, outcome, task_id),) = await ticks(h)
    assert (outcome, task_id) == ("failed", None)
    assert await tasks_of(h) == []


async def test_a_task_still_being_planned_counts_as_running_for_the_overlap(tmp_path: Path) -> None:
    h = await (await harness_in(tmp_path)).open(planner=True)
    try:
        await create(h, task={"request": "count the 500s in the web logs"})
        await h.advance(MINUTE)
        await h.advance(MINUTE)
        (task,) = await tasks_of(h)
        assert task.state == "planning" and h.planner is not None and h.planner.plans == [task.id]
        assert [o for _, o, _ in await ticks(h)] == ["created", "skipped"]
    finally:
        await h.close()


async def test_a_fixed_local_time_runs_once_on_the_night_the_clocks_go_back(tmp_path: Path) -> None:
    h = await (await harness_in(tmp_path)).open()
    try:
        h.clock.now = datetime(2026, 10, 31, 12, 0, tzinfo=UTC).timestamp()
        await create(h, cron="30 1 * * *", timezone="America/New_York")
        for _ in range(4 * 24):  # four days, hour by hour; each task is cancelled before the next tick
            await h.advance(3600)
            await h.step(*[CancelTask(t.id) for t in await tasks_of(h) if t.state == "running"])
        local = [h.engine.schedules.entries["sch_1"].cron.local(at).isoformat() for at, _, _ in await ticks(h)]
        assert local == [
            "2026-11-01T01:30:00-04:00",  # the first 01:30 (EDT) only; 01:30 EST an hour later does not run
            "2026-11-02T01:30:00-05:00",
            "2026-11-03T01:30:00-05:00",
            "2026-11-04T01:30:00-05:00",
        ]
    finally:
        await h.close()


async def test_old_ticks_are_pruned_to_the_newest_kept(tmp_path: Path) -> None:
    h = await (await harness_in(tmp_path, schedule_ticks_kept=10)).open()
    try:
        await create(h, cron="* * * * * *")  # every second (no device: each task fails at once)
        for _ in range(115):
            await h.advance(1)
        recorded = await ticks(h)
        assert 10 <= len(recorded) <= 15  # pruned once past 10 + PRUNE_SLACK, then a few more
        assert [at for at, _, _ in recorded] == [h.clock.now - n for n in range(len(recorded) - 1, -1, -1)]
        assert len(await tasks_of(h)) == 115  # the tasks stay
    finally:
        await h.close()


async def test_a_stored_schedule_that_no_longer_evaluates_never_fires_and_can_be_deleted(h: Harness) -> None:
    """After an upgrade its time zone is gone from the tz database: the engine still starts, the
    schedule keeps its name, fires nothing, says why when asked to change, and can be deleted."""
    await create(h)
    await h.store.update(Schedule, ("sch_1",), timezone="Atlantis/Capital")
    await h.restart()
    for _ in range(3):
        await h.advance(MINUTE)
    assert await tasks_of(h) == [] and h.fatal == []
    refused = await act(h, ScheduleAction.PAUSE)
    assert refused["code"] == "validation_error" and "delete it and create it again" in refused["detail"]
    assert (await create(h, "sch_2"))["code"] == "conflict"  # its name is still taken
    assert await act(h, ScheduleAction.DELETE) == {"ok": True}
    assert await stored.get(h.store, "sch_1") is None
    assert await create(h, "sch_2") == {"ok": True}


def test_a_schedule_change_crosses_replicas_as_json() -> None:
    item = ChangeSchedule(ScheduleAction.CREATE, "sch_1", definition())
    again = wire.load(wire.dump(item))
    assert isinstance(again, ChangeSchedule) and again == item
    paused = wire.load(wire.dump(ChangeSchedule(ScheduleAction.PAUSE, "sch_1")))
    assert paused == ChangeSchedule(ScheduleAction.PAUSE, "sch_1")


__all__ = ["ChangeSet", "Schedule"]
