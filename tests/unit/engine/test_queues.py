"""Placement returns decisions; the queues keep their own books and call nobody back."""

from __future__ import annotations

import random

import pytest

from orchestrator.domain.model import Liveness
from orchestrator.domain.run import TaskRun
from orchestrator.engine.queues import Assign, Enqueue, NeverRunnable, Queues
from orchestrator.engine.records import DeviceRun
from tests.unit.engine.parts import device, task


def queues(*runs: TaskRun, devices: list[DeviceRun]) -> Queues:
    q = Queues({r.id: r for r in runs}, {d.id: d for d in devices})
    for run in runs:
        for node_id in run.nodes:
            q.make_ready((run.id, node_id))
    return q


def test_a_free_capable_device_is_assigned_and_a_busy_one_gets_a_queue() -> None:
    run = task("t", "sim.act", "sim.act")
    dev = device("d1")
    q = queues(run, devices=[dev])
    placements = q.placements(now=1.0)
    first = next(placements)
    assert first == Assign(("t", "n1"), dev) and ("t", "n1") not in q.ready
    dev.current_batch = "b1"  # the engine carries the assignment out before the next decision
    assert next(placements) == Enqueue(("t", "n2"), dev)
    assert q.queued_at == {("t", "n2"): "d1"} and list(dev.queue) == [("t", "n2")] and not q.ready
    assert list(placements) == []


def test_a_node_no_device_could_ever_run_is_said_so() -> None:
    run = task("t", "sim.fly")
    q = queues(run, devices=[device("d1")])
    (decision,) = list(q.placements(now=1.0))
    assert isinstance(decision, NeverRunnable) and decision.key == ("t", "n1")
    assert "sim.fly" in decision.problem.message
    assert ("t", "n1") in q.ready  # the engine fails it; the queues decide nothing more


def test_capable_devices_out_of_service_mean_wait_not_fail() -> None:
    run = task("t", "sim.act")
    q = queues(run, devices=[device("d1", liveness=Liveness.OFFLINE)])
    assert list(q.placements(now=1.0)) == []
    assert ("t", "n1") in q.ready


def test_a_free_device_takes_its_queue_first_then_steals() -> None:
    run = task("t", "sim.act", "sim.act")
    busy, idle = device("d1"), device("d2", liveness=Liveness.OFFLINE)
    busy.current_batch = "b0"
    q = queues(run, devices=[busy, idle])
    assert [type(d) for d in q.placements(now=1.0)] == [Enqueue, Enqueue]
    idle.liveness = Liveness.ONLINE
    decisions = list(q.placements(now=2.0))
    assert decisions == [Assign(("t", "n1"), idle)]  # stolen from d1's queue, oldest first
    assert q.queued_at == {("t", "n2"): "d1"}
    assert q.unqueue_all(busy) == [("t", "n2")] and not busy.queue and not q.queued_at


def test_backing_off_nodes_wait() -> None:
    run = task("t", "sim.act")
    run.nodes["n1"].not_before = 10.0
    q = queues(run, devices=[device("d1")])
    assert list(q.placements(now=5.0)) == []
    assert [type(d) for d in q.placements(now=10.0)] == [Assign]


@pytest.mark.parametrize("seed", range(20))
def test_a_deep_queue_gives_what_ranking_it_whole_would(seed: int) -> None:
    """A device's queue is a heap (its next node in log time); under nodes queued, taken off
    (cancelled, stolen) and queued again in a seeded order, every pick is the node ranking the
    whole queue would pick: priority, then age, then arrival."""
    rng = random.Random(seed)
    runs = [task(f"t{i}", *["sim.act"] * 8, now=float(rng.randrange(3))) for i in range(3)]
    for run in runs:
        run.priority = rng.randrange(3)
        for rec in run.nodes.values():
            rec.ready_since = float(rng.randrange(5))
    dev = device("d1")
    dev.current_batch = "b0"
    q = queues(*runs, devices=[dev])
    assert all(isinstance(d, Enqueue) for d in q.placements(now=10.0))
    picked = 0
    while dev.queue:
        if rng.random() < 0.3:  # a node leaves the queue; sometimes it comes back (made ready again)
            key = rng.choice(list(dev.queue))
            q.take(key)
            if rng.random() < 0.5:
                q.make_ready(key)
                assert list(q.placements(now=10.0)) == [Enqueue(key, dev)]
            continue
        expected = min(dev.queue, key=q.order)
        dev.current_batch = None
        assert list(q.placements(now=10.0)) == [Assign(expected, dev)]
        dev.current_batch = f"b{picked}"
        picked += 1
    assert picked and not q.queued_at


@pytest.mark.parametrize("seed", range(40))
def test_the_device_picked_for_a_node_is_the_one_placement_ranks_first(seed: int) -> None:
    """`Queues._best` writes out `takes_work`, `occupied` and `placement.preference` inline for
    speed: over seeded fleets (cordoned, offline, busy, queued, failed-on devices) it must pick
    exactly what `placement.choose_queue` picks from the same devices."""
    from orchestrator.domain import placement
    from orchestrator.domain.model import AdminState

    rng = random.Random(seed)
    fleet = []
    for i in range(rng.randrange(1, 9)):
        dev = device(f"d{i}", liveness=rng.choice([Liveness.ONLINE] * 3 + [Liveness.SUSPECT, Liveness.OFFLINE]))
        dev.admin = rng.choice([AdminState.ACTIVE] * 3 + [AdminState.CORDONED])
        dev.current_batch = "b" if rng.random() < 0.5 else None
        for n in range(rng.choice([0, 0, 1, 3])):
            dev.queue[(f"q{i}", f"n{n}")] = None
        fleet.append(dev)
    failed_on = {d.id for d in fleet if rng.random() < 0.3}
    node = task("t", "sim.act").nodes["n1"].spec
    expected = placement.choose_queue(node, [d.view() for d in fleet], frozenset(failed_on))
    picked = Queues._best(fleet, failed_on)
    assert (picked.id if picked else None) == (expected.id if expected else None)
