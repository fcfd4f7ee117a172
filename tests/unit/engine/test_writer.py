"""The step writer: one transaction per commit, soft changes ride along or wait SOFT_FLUSH_S,
effects run only after a commit succeeded, and the lease guard goes with every write."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from orchestrator.engine.timers import Timers, Wake
from orchestrator.engine.writer import SOFT_FLUSH_S, EventType, StepWriter
from orchestrator.store.models import Attempt, Device
from orchestrator.store.repo import ChangeSet


@dataclass
class Written:
    """A store that keeps what it is given (and can refuse it)."""

    sets: list[ChangeSet] = field(default_factory=list)
    refuse: bool = False

    async def write(self, changes: ChangeSet) -> list[int]:
        if self.refuse:
            raise RuntimeError("the lease is lost")
        self.sets.append(changes)
        return list(range(1, len(changes.events) + 1))


@dataclass
class Published:
    events: list[dict[str, Any]] = field(default_factory=list)

    def publish(self, events: list[dict[str, Any]]) -> None:
        self.events += events


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def writer() -> tuple[StepWriter, Written, Published, Timers, Clock]:
    store, bus, timers, clock = Written(), Published(), Timers(), Clock()
    return StepWriter(store, bus, timers, clock), store, bus, timers, clock


async def test_a_soft_change_waits_for_a_hard_one_or_its_flush_time() -> None:
    w, store, _, timers, clock = writer()
    w.soft_update(Attempt, ("b1",), clock.now, status="accepted")
    assert timers.due(clock.now + SOFT_FLUSH_S) == [(clock.now + SOFT_FLUSH_S, Wake())]
    await w.commit()
    assert store.sets == []  # nothing hard to ride along with, and not due yet
    clock.now += SOFT_FLUSH_S
    await w.commit()
    (written,) = store.sets
    assert written.updates[Attempt] == {("b1",): {"status": "accepted"}}


async def test_a_soft_change_rides_along_and_the_later_hard_change_wins() -> None:
    w, store, _, _, clock = writer()
    w.soft_update(Attempt, ("b1",), clock.now, status="accepted")
    w.update(Attempt, ("b1",), status="succeeded")
    w.update(Device, ("d1",), fence=3)
    await w.commit()
    (written,) = store.sets
    assert written.updates[Attempt] == {("b1",): {"status": "succeeded"}}
    assert written.updates[Device] == {("d1",): {"fence": 3}}
    await w.commit()
    assert len(store.sets) == 1  # nothing left over


async def test_effects_and_events_follow_a_commit_and_never_a_failed_one() -> None:
    w, store, bus, _, clock = writer()
    ran: list[str] = []
    w.lease_guard = ("engine", "me", 7)
    w.event(EventType.TASK_STATE, "t1", None, clock.now, state="running")
    w.effect(lambda: ran.append("sent"))
    await w.commit()
    assert ran == ["sent"] and store.sets[0].guard == ("engine", "me", 7)
    assert [(e["type"], e["id"]) for e in bus.events] == [("task.state", 1)]
    store.refuse = True
    w.update(Device, ("d1",), fence=4)
    w.effect(lambda: ran.append("never"))
    with pytest.raises(RuntimeError, match="lease"):
        await w.commit()
    assert ran == ["sent"] and len(bus.events) == 1


async def test_a_failing_effect_does_not_stop_the_others() -> None:
    w, _, _, _, _ = writer()
    ran: list[int] = []

    def broken() -> None:
        raise ValueError("no route")

    w.effect(broken)
    w.effect(lambda: ran.append(1))
    await w.commit()
    assert ran == [1]
