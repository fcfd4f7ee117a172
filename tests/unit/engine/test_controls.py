"""A device's controls in the engine, step by step on a virtual clock (harness.py): desired state
with a generation and one writer. A stop, a resume and a budget reset are sent until the device
reports the generation applied (a lost frame, a new leader, a restored store change nothing of
that), a safety breach never lowers a stop, and only a resume lifts one."""

from __future__ import annotations

from typing import Any

from orchestrator.domain.model import AdminState, Liveness
from orchestrator.engine.records import CancelTask, FrameIn
from protocol.messages import Cancel, ControlState, DeviceControl, SafetyBreach
from tests.unit.engine.harness import Harness, one_node

BREACH = SafetyBreach(budget="destructive_per_minute", limit=3, detail="4 destructive actions in 60 s")
BREACH_REASON = "safety budget destructive_per_minute (limit 3) exceeded: 4 destructive actions in 60 s"


def controls_sent(h: Harness, dev: str) -> list[ControlState]:
    return [s.message.control for s in h.links.sent if isinstance(s.message, DeviceControl) and s.device_id == dev]


def breaches(h: Harness, budget: str) -> float:
    value = h.engine.metrics.registry.get_sample_value("orrery_safety_breaches_total", {"budget": budget})
    return value or 0.0


def link(h: Harness, dev: str, applied: int, batch: str | None = None) -> tuple[Any, ...]:
    """The device's link as its replica reports it, with the control generation it applied."""
    return (dev, h.epoch, Liveness.ONLINE, 0.0, batch, applied)  # type: ignore[attr-defined]


async def online(h: Harness, name: str = "d1") -> str:
    dev = await h.enroll(name)
    _, h.epoch = await h.connect(dev)  # type: ignore[attr-defined]
    return dev


async def test_a_stop_is_sent_again_until_the_device_reports_it_applied(h: Harness) -> None:
    """The stop's frame is lost (a relay dropped while Redis restarted): the device's heartbeats
    say it has not applied it, so it goes again, and only then stops going."""
    dev = await online(h)
    assert (await h.control(dev, "stop", "stopped by k1: fire"))["ok"]
    (first,) = controls_sent(h, dev)
    assert (first.gen, first.stopped, first.reason) == (1, True, "stopped by k1: fire")
    await h.live(10, "A", link(h, dev, applied=0))  # the frame never arrived
    again = controls_sent(h, dev)
    assert len(again) >= 3 and all(c == first for c in again)
    await h.live(10, "A", link(h, dev, applied=1))  # applied: nothing more is sent
    assert len(controls_sent(h, dev)) == len(again)
    assert (await h.device(dev)).admin_state == "stopped"


async def test_a_stop_committed_before_a_leader_died_reaches_the_agent_from_the_next_leader(h: Harness) -> None:
    dev = await online(h)
    await h.control(dev, "stop", "stopped by k1")
    h.links.sent.clear()  # the old leader died before its frame left
    await h.restart()
    await h.connect(dev, resumed=True)  # the device, which never applied it, says so in its hello
    (sent,) = controls_sent(h, dev)
    assert (sent.gen, sent.stopped) == (1, True)


async def test_a_breach_never_lowers_a_stop_and_only_resume_lifts_it(h: Harness) -> None:
    dev = await online(h)
    await h.control(dev, "stop", "stopped by k1")
    await h.step(FrameIn(dev, BREACH))  # the agent repeats its breach after reconnecting
    await h.step(FrameIn(dev, BREACH))
    row = await h.device(dev)
    assert row.admin_state == "stopped"
    assert controls_sent(h, dev)[-1].stopped
    history, _ = await h.store.device_history(dev, 10, None)
    assert BREACH_REASON in history[0].reason  # recorded, not acted on
    await h.restart()  # and the store agrees with memory
    assert h.engine.fleet.devices[dev].admin is AdminState.STOPPED
    for action in ("uncordon", "drain", "cordon"):
        refused = await h.control(dev, action)
        assert refused["ok"] is False and refused["code"] == "conflict" and "only resume" in refused["detail"]
    resumed = await h.control(dev, "resume", "resumed by k1")
    assert resumed["ok"]
    row = await h.device(dev)
    assert (row.admin_state, row.cordon_reason) == ("cordoned", BREACH_REASON)  # it breached: still cordoned
    assert not controls_sent(h, dev)[-1].stopped


async def test_a_breach_cordons_once_with_its_reason_and_survives_a_restart(h: Harness) -> None:
    dev = await online(h)
    await h.step(FrameIn(dev, BREACH))
    row = await h.device(dev)
    assert (row.admin_state, row.cordon_reason) == ("cordoned", BREACH_REASON)
    history, _ = await h.store.device_history(dev, 10, None)
    assert history[0].state == "cordoned" and history[0].reason == BREACH_REASON
    assert breaches(h, "destructive_per_minute") == 1
    await h.step(FrameIn(dev, BREACH))  # repeated on a new session: not news
    assert breaches(h, "destructive_per_minute") == 1
    assert len((await h.store.device_history(dev, 10, None))[0]) == len(history)
    await h.submit(one_node("n", "sim.act"))
    assert not h.batches(dev)
    await h.restart()
    assert h.engine.fleet.devices[dev].admin is AdminState.CORDONED
    assert h.engine.fleet.devices[dev].cordon_reason == BREACH_REASON


async def test_an_uncordon_resets_the_agents_budgets_and_work_flows_again(h: Harness) -> None:
    dev = await online(h)
    await h.step(FrameIn(dev, BREACH))
    await h.submit(one_node("n", "sim.act"))
    assert not h.batches(dev)
    assert (await h.control(dev, "uncordon"))["ok"]
    (reset,) = controls_sent(h, dev)
    assert (reset.gen, reset.budgets_reset, reset.stopped) == (1, 1, False)
    assert h.batches(dev), "the queued node is placed once the device is back"
    assert (await h.device(dev)).admin_state == "active"


async def test_a_revoked_device_takes_no_control_and_no_late_breach(h: Harness) -> None:
    dev = await online(h)
    assert (await h.control(dev, "revoke"))["ok"]
    await h.step(FrameIn(dev, BREACH))
    assert (await h.device(dev)).admin_state == "revoked"
    assert breaches(h, "destructive_per_minute") == 0
    assert (await h.control(dev, "resume"))["code"] == "conflict"
    assert h.links.closed == [(dev, 4401)]


async def test_a_resume_asked_on_controls_that_changed_since_is_refused(h: Harness) -> None:
    """A resume (or uncordon) names the generation its operator saw: one asked again after a newer
    stop (its answer lost between replicas, say) cannot lift that stop."""
    dev = await online(h)
    await h.control(dev, "stop")  # generation 1
    seen = (await h.control(dev, "resume", request_id="r1", expect_gen=1))["gen"]  # 2
    await h.control(dev, "stop")  # generation 3
    stale = await h.control(dev, "resume", request_id="r2", expect_gen=1)
    assert stale["ok"] is False and "changed" in stale["detail"]
    assert (await h.device(dev)).admin_state == "stopped"
    again = await h.control(dev, "resume", request_id="r1", expect_gen=1)  # the same request, asked again
    assert again == {"ok": True, "changed": True, "gen": seen}  # answered as before, and nothing lifted
    assert (await h.device(dev)).admin_state == "stopped"


async def test_a_device_ahead_of_a_restored_store_gets_the_controls_above_its_own_generation(h: Harness) -> None:
    dev = await h.enroll("d1")
    epoch = await h.store.open_session(dev)
    hello = h.hello_frame(dev).model_copy(update={"control_gen": 7})
    from orchestrator.engine.records import DeviceHello

    await h.step(DeviceHello(dev, hello, False, epoch, "A"))
    (sent,) = controls_sent(h, dev)
    assert sent.gen == 8 and not sent.stopped
    assert ((await h.device(dev)).control or {}).get("gen") == 8


async def test_a_stopped_device_gets_no_work_until_it_is_resumed(h: Harness) -> None:
    dev = await online(h)
    await h.control(dev, "stop")
    task = await h.submit(one_node("n", "sim.act"))
    assert h.batches(dev) == []
    assert (await h.task(task))["nodes"] == {"n": "ready"}
    await h.control(dev, "resume")
    assert len(h.batches(dev)) == 1


async def test_a_cancel_lost_on_its_way_is_sent_again_while_the_device_still_runs_the_batch(h: Harness) -> None:
    """The cancel's frame was dropped (a relay lost while Redis restarted): the device's heartbeats
    still name the batch, so the cancel goes again, a few seconds apart, until they do not."""
    dev = await online(h)
    task = await h.submit(one_node("n", "sim.act"))
    (batch,) = h.batches(dev)
    await h.step(CancelTask(task))
    first = cancels(h, dev)
    assert first == [batch.batch_id]
    await h.live(10, "A", link(h, dev, applied=0, batch=batch.batch_id))
    assert len(cancels(h, dev)) >= 3 and set(cancels(h, dev)) == {batch.batch_id}
    sent = len(cancels(h, dev))
    await h.live(10, "A", link(h, dev, applied=0))  # it stopped: nothing more
    assert len(cancels(h, dev)) == sent


def cancels(h: Harness, dev: str) -> list[str]:
    return [s.message.batch_id for s in h.links.sent if isinstance(s.message, Cancel) and s.device_id == dev]
