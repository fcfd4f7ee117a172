"""A schedule's next tick when the leader's clock is behind its last recorded tick (a failover to
a replica whose clock lags, or a clock stepped back): it is the first tick after both now and the
last recorded one, so what the schedule shows and arms is never a tick it already fired."""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator.engine.schedule_records import ScheduleAction
from tests.unit.engine.harness import T0, Harness
from tests.unit.engine.test_schedules import MINUTE, act, create, row, tasks_of, ticks


async def test_a_schedule_resumed_by_a_leader_whose_clock_is_behind_waits_for_the_tick_after_its_last(
    h: Harness,
) -> None:
    await create(h)  # every minute
    await h.advance(MINUTE)  # the tick at T0 + 1 min is recorded and its task made
    await act(h, ScheduleAction.PAUSE)
    await h.restart()  # the next leader...
    h.clock.now -= 3 * MINUTE  # ...whose clock is three minutes behind the last one's
    assert await act(h, ScheduleAction.RESUME) == {"ok": True}
    assert (await row(h)).next_at == datetime.fromtimestamp(T0 + 2 * MINUTE, UTC)
    while h.clock.now < T0 + 2 * MINUTE:
        await h.advance(MINUTE)
    assert [at for at, _, _ in await ticks(h)] == [T0 + MINUTE, T0 + 2 * MINUTE]
    assert len(await tasks_of(h)) == 2
    assert (await row(h)).next_at == datetime.fromtimestamp(T0 + 3 * MINUTE, UTC)
