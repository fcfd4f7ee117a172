"""The engine keeps its promises whatever order inputs arrive in, and whatever is lost on the way
(issue 12). Each test drives the real engine step by step on a virtual clock (tests/unit/engine/
harness.py) and checks what the store holds afterwards, which is what a restart would see."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchestrator.domain.model import Liveness
from orchestrator.engine.records import Hearing, LivenessChanged
from tests.unit.engine.harness import Harness, accepted, one_node, refused, results

# ---------------------------------------------------------------- who speaks for a device


async def test_a_replica_the_device_left_cannot_declare_it_offline(h: Harness) -> None:
    """Defect 1: the device moved from replica A to B; A's liveness watcher later reports its old
    link suspect, then offline. The device is healthy on B: nothing of that may count."""
    dev = await h.enroll("mover")
    _, old = await h.connect(dev, "A")
    task = await h.submit(one_node())
    (batch,) = h.batches(dev)
    current, new = await h.connect(dev, "B")
    assert current and new > old
    fence = (await h.device(dev)).fence
    await h.step(LivenessChanged(dev, Liveness.SUSPECT, old, "A"))
    await h.step(LivenessChanged(dev, Liveness.OFFLINE, old, "A"))
    await h.step(h.report("A", (dev, old, Liveness.SUSPECT, 60.0, None)))
    row = await h.device(dev)
    assert (row.liveness, row.fence) == ("online", fence)
    assert (await h.task(task))["attempts"] == [("n", dev, "dispatched", None)]
    assert h.engine.devices[dev].route.replica == "B"
    await h.step(results(dev, batch))
    assert (await h.task(task))["state"] == "succeeded"


async def test_a_hello_from_an_older_connection_that_arrives_late_is_refused(h: Harness) -> None:
    """OFFLINE or a hello from connection 1 reaching the engine after connection 2's hello."""
    dev = await h.enroll("racer")
    epoch_a = await h.store.open_session(dev)  # A accepted the socket first...
    current, epoch_b = await h.connect(dev, "B")  # ...but B's hello reached the engine first
    assert current and epoch_b > epoch_a
    from orchestrator.engine.records import DeviceHello

    (late,) = await h.step(DeviceHello(dev, h.hello_frame(dev), False, epoch_a, "A"))
    assert late is False
    await h.step(LivenessChanged(dev, Liveness.OFFLINE, epoch_a, "A"))
    assert (await h.device(dev)).liveness == "online"
    assert h.engine.devices[dev].route.replica == "B"


# ---------------------------------------------------------------- lost hints are re-derived


async def test_a_task_whose_created_hint_was_lost_is_adopted_from_the_store(h: Harness) -> None:
    """Defect 4: the submitting replica's `task_created` never reached the leader."""
    dev = await h.enroll("worker")
    await h.connect(dev)
    task = await h.submit(one_node(), notify=False)
    assert h.batches(dev) == []
    await h.advance(h.settings.reconcile_interval_s)
    (batch,) = h.batches(dev)
    assert batch.task_id == task
    await h.step(results(dev, batch))
    assert (await h.task(task))["state"] == "succeeded"


async def test_a_lost_batch_accepted_is_re_derived_from_the_device_heartbeat(h: Harness) -> None:
    """Defect 4 (accepts): without it, the accept deadline would time a running batch out."""
    dev = await h.enroll("quiet")
    _, epoch = await h.connect(dev)
    task = await h.submit(one_node())
    (batch,) = h.batches(dev)
    await h.live(h.settings.batch_accept_timeout_s + 1, "A", (dev, epoch, Liveness.ONLINE, 0.5, batch.batch_id))
    assert (await h.task(task))["attempts"] == [("n", dev, "accepted", None)]
    await h.step(results(dev, batch))
    assert (await h.task(task))["state"] == "succeeded"


async def test_a_device_nobody_reports_goes_offline_even_if_its_offline_notice_was_lost(h: Harness) -> None:
    """The replica holding the link died (or its OFFLINE was lost): no report names the device."""
    dev = await h.enroll("vanished")
    await h.connect(dev)
    await h.advance(h.settings.heartbeat_timeout_s + h.settings.link_report_interval_s + 0.1)
    assert (await h.device(dev)).liveness == "offline"


async def test_while_the_engine_cannot_hear_other_replicas_their_devices_are_not_declared_offline(
    h: Harness,
) -> None:
    """Redis down: reports from replica B cannot arrive, which says nothing about B's devices."""
    dev = await h.enroll("far")
    await h.connect(dev, "B")
    await h.step(Hearing(False))
    await h.advance(h.settings.heartbeat_timeout_s * 3)
    assert (await h.device(dev)).liveness == "online"
    await h.step(Hearing(True))  # back: B's device gets a full timeout to be reported again
    await h.advance(h.settings.heartbeat_timeout_s / 2)
    assert (await h.device(dev)).liveness == "online"
    await h.advance(h.settings.heartbeat_timeout_s)
    assert (await h.device(dev)).liveness == "offline"


# ---------------------------------------------------------------- busy, fences, deadlines


async def test_a_device_is_not_left_busy_after_the_engine_gives_up_on_its_batch(h: Harness) -> None:
    """Defect 7: an accept timeout ended the attempt but left `current_batch` set forever."""
    dev = await h.enroll("mute")
    _, epoch = await h.connect(dev)
    task = await h.submit(one_node())
    await h.live(h.settings.batch_accept_timeout_s - 0.5, "A", (dev, epoch, Liveness.ONLINE, 0.1, None))
    assert h.engine.devices[dev].current_batch is not None
    await h.advance(1)  # the accept deadline passes; no report comes in between
    assert (await h.task(task))["errors"] == {"n": "timeout"}
    assert (await h.device(dev)).current_batch_id is None
    assert h.engine.devices[dev].current_batch is None


async def test_a_batch_the_device_refuses_as_stale_runs_again_above_the_fence_it_has_seen(h: Harness) -> None:
    """Defect 7: the agent's ledger has seen fence 57 (its data dir outlived a re-enrolment, or our
    database was restored from a backup). Its refusal says so; the node is placed again, without
    spending its one try, with a fence above 57."""
    dev = await h.enroll("veteran")
    await h.connect(dev)
    task = await h.submit(one_node())
    (first,) = h.batches(dev)
    await h.step(refused(dev, first, "stale_fence", fence_seen=57))
    assert (await h.task(task))["nodes"] == {"n": "ready"}
    await h.advance(h.settings.reconcile_interval_s)  # the retry backoff passes
    second = h.batches(dev)[-1]
    assert second.batch_id != first.batch_id and second.fence > 57
    await h.step(results(dev, second))
    assert (await h.task(task))["state"] == "succeeded"


async def test_a_hello_carrying_a_higher_fence_raises_ours_before_any_assignment(h: Harness) -> None:
    dev = await h.enroll("restored")
    await h.connect(dev, fence_seen=40)
    await h.submit(one_node())
    (batch,) = h.batches(dev)
    assert batch.fence > 40
    assert (await h.device(dev)).fence == batch.fence


async def test_every_batch_carries_a_deadline_and_one_nobody_answers_ends_by_it(h: Harness) -> None:
    """Defect 11: a node without timeout_s used to get a batch without a deadline, so a device
    that heartbeats but never answers held the node forever."""
    dev = await h.enroll("stuck")
    _, epoch = await h.connect(dev)
    task = await h.submit({"nodes": [{"id": "n", "commands": [{"tool": "sim.act", "timeout_s": 20}]}]})
    (batch,) = h.batches(dev)
    assert batch.deadline is not None
    assert batch.deadline.timestamp() == pytest.approx(h.clock.now + 20 + 30)
    await h.step(accepted(dev, batch))
    await h.live(49, "A", (dev, epoch, Liveness.ONLINE, 0.5, batch.batch_id))  # it keeps heartbeating
    assert (await h.task(task))["nodes"] == {"n": "running"}
    await h.live(2, "A", (dev, epoch, Liveness.ONLINE, 0.5, batch.batch_id))
    assert (await h.task(task))["errors"] == {"n": "timeout"}


# ---------------------------------------------------------------- restarts


async def test_accept_deadlines_are_re_armed_after_a_restart(h: Harness) -> None:
    dev = await h.enroll("lost-accept")
    await h.connect(dev)
    task = await h.submit(one_node())
    await h.restart()
    _, epoch = await h.connect(dev)  # the agent reconnects; the batch goes again and is lost again
    await h.live(h.settings.batch_accept_timeout_s + 1, "A", (dev, epoch, Liveness.ONLINE, 0.1, None))
    assert (await h.task(task))["errors"] == {"n": "timeout"}


async def test_a_device_resuming_its_session_after_an_engine_restart_gets_its_batches_again(h: Harness) -> None:
    """After a failover the device resumed its session on a surviving replica: the old leader's
    frames may never have reached that replica, so the new engine must send them again."""
    dev = await h.enroll("survivor")
    await h.connect(dev, "B")
    await h.submit(one_node())
    (batch,) = h.batches(dev)
    await h.restart()
    h.links.sent.clear()
    await h.connect(dev, "B", resumed=True)
    assert [b.batch_id for b in h.batches(dev)] == [batch.batch_id]


async def test_an_exception_in_a_step_is_fatal_not_silent(tmp_path: Path) -> None:
    """An unexpected error in timers or scheduling used to end the loop and leave the process
    serving with no engine. Here the scheduler breaks on a real input; the engine must report a
    fatal error (the process stops and a restart rebuilds from the store)."""
    from orchestrator.engine.core import Engine

    class Broken(Engine):
        def _schedule(self, now: float) -> None:
            raise RuntimeError("scheduler bug")

    h = await asyncio.to_thread(Harness, tmp_path)
    engine = Broken(h.settings, h.store, h.engine.bus, clock=h.clock)
    stopped = asyncio.Event()
    engine.on_fatal = lambda exc: (h.fatal.append(exc), stopped.set())
    await engine.start()
    try:
        engine.notify(LivenessChanged("nobody", Liveness.ONLINE))
        async with asyncio.timeout(10):
            await stopped.wait()
        assert isinstance(h.fatal[0], RuntimeError) and engine.failed is h.fatal[0]
        with pytest.raises(RuntimeError, match="already started"):
            await engine.start()
    finally:
        await engine.stop()
        await h.close()


# ---------------------------------------------------------------- re-planning


async def test_a_re_plan_that_removes_a_node_and_changes_an_edge_is_stored_even_with_soft_updates_pending(
    tmp_path: Path,
) -> None:
    """Defect 5: with a `batch_accepted` waiting to ride along (a soft update), the commit dropped
    the edit's deletes, and a re-plan turning `a -> d` from success into failure was never stored.
    After a restart the removed node came back and ran."""
    from orchestrator.domain.edits import AddEdge, EditList, RemoveEdge, RemoveNode
    from orchestrator.domain.model import EdgeSpec
    from orchestrator.engine.records import ReplanDone

    h = await (await asyncio.to_thread(Harness, tmp_path)).open(planner=True)
    try:
        dev = await h.enroll("solo")
        await h.connect(dev)
        dag = {
            "nodes": [{"id": n, "commands": [{"tool": "sim.act"}]} for n in ("a", "b", "c", "d")],
            "edges": [{"from": "a", "to": "c"}, {"from": "a", "to": "d"}],
        }
        task = await h.submit(dag, replan=True)
        (first,) = h.batches(dev)
        assert first.node_id == "a"
        await h.step(results(dev, first, status="failure"))  # a fails for good: held for the re-planner
        assert h.planner is not None and h.planner.replans == [(task, "a")]
        second = h.batches(dev)[-1]
        assert second.node_id == "b"
        edits = EditList(
            reason="compensate instead",
            edits=[
                RemoveNode(id="c"),
                RemoveEdge.model_validate({"from": "a", "to": "d"}),
                AddEdge(edge=EdgeSpec.model_validate({"from": "a", "to": "d", "on": "failure"})),
            ],
        )
        await h.step(accepted(dev, second), ReplanDone(task, "a", edits))  # a soft update rides along
        await h.restart()
        stored = await h.task(task)
        assert set(stored["nodes"]) == {"a", "b", "d"}
        assert stored["edges"] == [("a", "d", "failure")]
        await h.connect(dev)
        await h.step(results(dev, second))
        (third,) = [b for b in h.batches(dev) if b.node_id == "d"]
        await h.step(results(dev, third))
        final = await h.task(task)
        assert final["nodes"] == {"a": "failed", "b": "succeeded", "d": "succeeded"}
        assert final["state"] == "succeeded"  # a's failure is handled by the failure edge to d
        assert "c" not in {b.node_id for b in h.batches(dev)}
    finally:
        await h.close()


async def test_a_label_change_whose_notice_was_lost_is_adopted_from_the_store(h: Harness) -> None:
    """A label change written by the API whose notice never reached the engine is in the store:
    the engine must act on it once it compares its devices with the store, not only when told."""
    from orchestrator.store.models import Device

    dev = await h.enroll("relabelled-quietly")
    _, epoch = await h.connect(dev)
    await h.store.update(Device, (dev,), labels={"role": "db"})
    await h.live(5 * h.settings.reconcile_interval_s + 0.5, "A", (dev, epoch, Liveness.ONLINE, 0.1, None))
    assert h.engine.devices[dev].labels == {"role": "db"}
    await h.submit(one_node(placement={"labels": {"role": "db"}}))
    assert len(h.batches(dev)) == 1


async def test_the_admin_state_in_the_store_is_the_engines_own_and_never_read_back(h: Harness) -> None:
    """The engine is the one writer of a device's admin state: a row changed behind its back (no
    writer may) does not make it forget a stop it holds."""
    from orchestrator.domain.controls import ControlAction
    from orchestrator.engine.records import ControlDevice
    from orchestrator.store.models import Device

    dev = await h.enroll("stopped-here")
    _, epoch = await h.connect(dev)
    await h.step(ControlDevice(dev, ControlAction.STOP, "stopped by an operator"))
    await h.store.update(Device, (dev,), admin_state="active")
    await h.live(5 * h.settings.reconcile_interval_s + 0.5, "A", (dev, epoch, Liveness.ONLINE, 0.1, None))
    assert h.engine.devices[dev].admin.value == "stopped"
    await h.submit(one_node(placement={"device": "stopped-here"}))
    assert h.batches(dev) == []


async def test_a_fleet_larger_than_a_page_is_compared_a_page_per_step(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device rows are compared with memory a page per step (a step over 10,000 rows held
    the loop, and so every heartbeat answer, for ~80 ms): a change on the last page is still
    adopted, a few steps after the pass began, and no step reads more than a page."""
    labelled = {"zone": "b"}
    from orchestrator.engine import core
    from orchestrator.store.models import Device

    monkeypatch.setattr(core, "DEVICE_PAGE", 2)
    devices = [await h.enroll(f"fleet{i}") for i in range(5)]
    last = max(devices)
    await h.store.update(Device, (last,), labels=labelled)
    reads: list[tuple[str, int, int]] = []
    real = h.store.device_admin

    async def counted(after: str = "", limit: int = 1_000_000) -> list[tuple[str, str, str, dict[str, object], str]]:
        rows = await real(after, limit)
        reads.append((after, limit, len(rows)))
        return rows

    monkeypatch.setattr(h.store, "device_admin", counted)
    for _ in range(core.DEVICE_RECONCILE_EVERY):
        await h.advance(h.settings.reconcile_interval_s)
    assert h.engine.devices[last].labels == {}  # one page read so far: not there yet
    assert reads == [("", 2, 2)]
    for _ in range(3):
        await h.advance(0)
    assert h.engine.devices[last].labels == labelled
    assert [(after, n) for after, _, n in reads] == [("", 2), (sorted(devices)[1], 2), (sorted(devices)[3], 1)]
    await h.advance(0)
    assert len(reads) == 3  # the pass ended with the short page


async def test_a_device_still_marked_busy_with_a_closed_batch_is_freed_by_its_next_idle_heartbeat(h: Harness) -> None:
    """Defect 7, re-derived: whatever left `current_batch` pointing at a batch the engine closed,
    the device's own heartbeat (it runs nothing) frees it."""
    from orchestrator.store.models import Device

    dev = await h.enroll("stale-busy")
    _, epoch = await h.connect(dev)
    await h.store.update(Device, (dev,), current_batch_id="b_closed_long_ago")
    h.engine.devices[dev].current_batch = "b_closed_long_ago"
    await h.step(h.report("A", (dev, epoch, Liveness.ONLINE, 0.1, None)))
    assert h.engine.devices[dev].current_batch is None
    assert (await h.device(dev)).current_batch_id is None


async def test_a_task_waiting_for_its_plan_is_planned_even_if_its_created_hint_was_lost(tmp_path: Path) -> None:
    from orchestrator.store.models import Task

    h = await (await asyncio.to_thread(Harness, tmp_path)).open(planner=True)
    try:
        task = await h.submit(one_node(), notify=False)
        await h.store.update(Task, (task,), state="planning", request="do something")
        await h.advance(h.settings.reconcile_interval_s)
        await h.advance(h.settings.reconcile_interval_s)
        assert h.planner is not None and h.planner.plans == [task]  # asked once, not once per round
    finally:
        await h.close()


async def test_a_batch_lost_on_its_way_is_sent_again_when_the_idle_device_does_not_have_it(h: Harness) -> None:
    """A frame relayed through Redis was dropped (a dead pooled connection after a Redis restart):
    the device heartbeats and runs nothing. The engine sends the batch again instead of waiting
    for the accept deadline to fail the node."""
    dev = await h.enroll("missed")
    _, epoch = await h.connect(dev)
    task = await h.submit(one_node())
    (batch,) = h.batches(dev)
    await h.live(5, "A", (dev, epoch, Liveness.ONLINE, 0.2, None))
    again = [b for b in h.batches(dev) if b.batch_id == batch.batch_id]
    assert 2 <= len(again) <= 3  # re-sent, and not on every report
    await h.step(accepted(dev, batch))
    sent = len(h.batches(dev))
    await h.live(10, "A", (dev, epoch, Liveness.ONLINE, 0.2, batch.batch_id))
    assert len(h.batches(dev)) == sent  # accepted and running: left alone
    await h.step(results(dev, batch))
    assert (await h.task(task))["state"] == "succeeded"


async def test_an_accepted_batch_an_agent_lost_in_a_restart_is_sent_again_when_it_idles(h: Harness) -> None:
    """The agent accepted the batch, then crashed; its redelivery at the next hello was lost on
    the way (a relay dropped). It heartbeats idle while the engine holds the batch open, which a
    wait for an approval would hold for ever (its deadline waits): the batch goes again."""
    dev = await h.enroll("forgot")
    _, epoch = await h.connect(dev)
    task = await h.submit(one_node())
    (batch,) = h.batches(dev)
    await h.step(accepted(dev, batch))
    _, epoch = await h.connect(dev)  # restarted: a new session (its redelivery, lost)
    sent = len(h.batches(dev))
    await h.live(5, "A", (dev, epoch, Liveness.ONLINE, 0.2, None))
    assert sent < len(h.batches(dev)) <= sent + 2  # sent again, and not on every report
    assert all(b.batch_id == batch.batch_id for b in h.batches(dev))
    await h.step(results(dev, batch))
    assert (await h.task(task))["state"] == "succeeded"


async def test_an_agent_node_ended_with_a_step_still_out_frees_its_device_when_the_step_reports(
    tmp_path: Path,
) -> None:
    from orchestrator.engine.records import AgentDone, AgentStep, ToolCall

    h = await (await asyncio.to_thread(Harness, tmp_path)).open(planner=True)
    try:
        dev = await h.enroll("driven")
        await h.connect(dev)
        task = await h.submit({"nodes": [{"id": "g", "kind": "agent", "instruction": "look around"}]})
        assert h.planner is not None
        (attempt,) = h.planner.agents
        await h.step(AgentStep(attempt, [ToolCall("sim.look", {})]))
        (step,) = h.batches(dev)
        await h.step(AgentDone(attempt, False, error_code="timeout", error_message="too slow"))
        assert h.engine.devices[dev].current_batch == step.batch_id  # the step may still be running
        await h.step(results(dev, step))
        assert h.engine.devices[dev].current_batch is None
        assert (await h.device(dev)).current_batch_id is None
        assert (await h.task(task))["state"] == "failed"
    finally:
        await h.close()


async def test_a_late_suspect_notice_does_not_bring_an_offline_device_back(h: Harness) -> None:
    """A report taken before the link ended (or a suspect notice that crossed the engine's own
    offline judgement) arrives after the device was declared offline: it stays offline, and its
    history ends with `offline`. A frame from it (online) still brings it back."""
    dev = await h.enroll("late")
    _, epoch = await h.connect(dev, replica="A")
    await h.advance(h.settings.heartbeat_timeout_s + h.settings.link_report_interval_s + 0.1)
    assert (await h.device(dev)).liveness == "offline"
    await h.step(h.report("A", (dev, epoch, Liveness.SUSPECT, 2.0, None)))
    await h.step(LivenessChanged(dev, Liveness.SUSPECT, epoch, "A"))
    assert (await h.device(dev)).liveness == "offline"
    history = [row.state for row in (await h.store.device_history(dev, 10, None))[0]]
    assert history[0] == "offline", history
    await h.step(LivenessChanged(dev, Liveness.ONLINE, epoch, "A"))
    assert (await h.device(dev)).liveness == "online"
