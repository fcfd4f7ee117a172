"""The rules a schedule's ticks follow (issue 20): which ticks are due after an outage and which of
them runs, and what a due tick becomes while the previous task runs."""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator.domain import cron
from orchestrator.domain.schedule import (
    COUNT_CAP,
    MISSED_LISTED,
    Overlap,
    ScheduledTask,
    TickOutcome,
    backlog,
    on_due,
    tick_key,
)

T = datetime(2026, 6, 1, 12, 0, tzinfo=UTC).timestamp()  # a minute's tick
EVERY_MINUTE = cron.parse("* * * * *", "UTC", T)


def test_a_tick_due_now_runs_and_nothing_is_missed() -> None:
    due = backlog(EVERY_MINUTE, T, T + 0.2, deadline_s=60)
    assert (due.run, due.missed, due.unlisted, due.unlisted_from) == (T, [], 0, None)


def test_a_tick_later_than_the_deadline_is_missed_not_run() -> None:
    due = backlog(EVERY_MINUTE, T, T + 45, deadline_s=30)
    assert (due.run, due.missed) == (None, [T])


def test_after_an_outage_the_latest_tick_within_the_deadline_runs_and_the_rest_are_missed() -> None:
    due = backlog(EVERY_MINUTE, T, T + 5 * 60 + 10, deadline_s=60)
    assert due.run == T + 300
    assert due.missed == [T, T + 60, T + 120, T + 180, T + 240]
    assert due.unlisted == 0


def test_a_long_outage_lists_the_newest_missed_ticks_and_counts_the_older_ones() -> None:
    due = backlog(EVERY_MINUTE, T, T + 100 * 60, deadline_s=3600)
    assert due.run == T + 6000
    assert len(due.missed) == MISSED_LISTED and due.missed[-1] == T + 5940
    assert (due.unlisted_from, due.unlisted, due.more) == (T, 100 - MISSED_LISTED, False)
    assert due.unlisted_from < due.missed[0]  # its entry never collides with a listed tick


def test_an_outage_past_the_counting_cap_still_finds_the_tick_to_run() -> None:
    every_second = cron.parse("* * * * * *", "UTC", T)
    due = backlog(every_second, T, T + COUNT_CAP + 50_000, deadline_s=30)
    assert due.run == T + COUNT_CAP + 50_000
    assert due.more and due.unlisted >= COUNT_CAP - MISSED_LISTED and due.unlisted_from == T
    assert len(due.missed) == MISSED_LISTED and due.missed[-1] == due.run - 1


def test_a_free_schedule_starts_its_tick() -> None:
    assert on_due(Overlap.SKIP, previous_running=False, queued=0, max_queued=5) is TickOutcome.CREATED
    assert on_due(Overlap.QUEUE, previous_running=False, queued=0, max_queued=5) is TickOutcome.CREATED


def test_while_the_previous_task_runs_a_tick_is_skipped_or_queued_up_to_the_bound() -> None:
    assert on_due(Overlap.SKIP, previous_running=True, queued=0, max_queued=5) is TickOutcome.SKIPPED
    assert on_due(Overlap.QUEUE, previous_running=True, queued=4, max_queued=5) is TickOutcome.QUEUED
    assert on_due(Overlap.QUEUE, previous_running=True, queued=5, max_queued=5) is TickOutcome.SKIPPED
    # ticks already waiting go first, even when the previous task has just ended
    assert on_due(Overlap.QUEUE, previous_running=False, queued=1, max_queued=5) is TickOutcome.QUEUED


def test_each_tick_has_its_own_idempotency_key() -> None:
    assert tick_key("sch_1", T) != tick_key("sch_1", T + 60) != tick_key("sch_2", T + 60)
    assert tick_key("sch_1", T) == tick_key("sch_1", T + 0.0)


def test_a_planned_or_agent_task_needs_an_llm() -> None:
    assert ScheduledTask.from_body({"request": "count the 500s"}).needs_llm
    agent = {"dag": {"nodes": [{"id": "a", "kind": "agent", "instruction": "tidy up"}]}}
    assert ScheduledTask.from_body(agent).needs_llm
    tool = ScheduledTask.from_body({"dag": {"nodes": [{"id": "t", "commands": [{"tool": "shell.run"}]}]}})
    assert not tool.needs_llm and tool.spec is not None and tool.replan is False
