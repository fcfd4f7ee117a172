"""Issue 18: a device's `safety_breach` cordons it durably with its reason (once, however often
the agent repeats it), survives an engine restart, and an operator's uncordon sends `budget_reset`."""

from __future__ import annotations

from orchestrator.domain.model import AdminState
from orchestrator.engine.records import DeviceChanged, FrameIn
from orchestrator.store.models import Device
from protocol.messages import BudgetReset, SafetyBreach
from tests.unit.engine.harness import Harness, one_node

BREACH = SafetyBreach(budget="destructive_per_minute", limit=3, detail="4 destructive actions in 60 s")


def breaches(h: Harness, budget: str) -> float:
    value = h.engine.metrics.registry.get_sample_value("orrery_safety_breaches_total", {"budget": budget})
    return value or 0.0


async def test_a_breach_cordons_once_with_its_reason_and_survives_a_restart(h: Harness) -> None:
    dev = await h.enroll("d1")
    await h.connect(dev)
    await h.step(FrameIn(dev, BREACH))
    row = await h.device(dev)
    assert row.admin_state == AdminState.CORDONED
    assert row.cordon_reason == "safety budget destructive_per_minute (limit 3) exceeded: 4 destructive actions in 60 s"
    history, _ = await h.store.device_history(dev, 10, None)
    assert history[0].state == "cordoned" and history[0].reason == row.cordon_reason
    assert breaches(h, "destructive_per_minute") == 1

    await h.step(FrameIn(dev, BREACH))  # repeated on a new session: not news
    assert breaches(h, "destructive_per_minute") == 1
    assert len((await h.store.device_history(dev, 10, None))[0]) == len(history)

    # No work is placed on it, and the cordon outlives the engine.
    await h.submit(one_node("n", "sim.act"))
    assert not h.batches(dev)
    await h.restart()
    assert h.engine.fleet.devices[dev].admin is AdminState.CORDONED
    assert h.engine.fleet.devices[dev].cordon_reason == row.cordon_reason


async def test_an_operators_uncordon_sends_budget_reset_and_work_flows_again(h: Harness) -> None:
    dev = await h.enroll("d1")
    await h.connect(dev)
    await h.step(FrameIn(dev, BREACH))
    await h.submit(one_node("n", "sim.act"))
    assert not h.batches(dev)
    await h.store.update(Device, (dev,), admin_state=AdminState.ACTIVE.value, cordon_reason=None)  # as the API does
    await h.step(DeviceChanged(dev))
    resets = [s for s in h.links.sent if isinstance(s.message, BudgetReset) and s.device_id == dev]
    assert len(resets) == 1
    assert h.batches(dev), "the queued node is placed once the device is back"


async def test_a_revoked_device_is_not_cordoned_by_a_late_breach(h: Harness) -> None:
    dev = await h.enroll("d1")
    await h.connect(dev)
    await h.store.update(Device, (dev,), admin_state=AdminState.REVOKED.value)
    await h.step(DeviceChanged(dev))
    await h.step(FrameIn(dev, BREACH))
    assert (await h.device(dev)).admin_state == AdminState.REVOKED
    assert breaches(h, "destructive_per_minute") == 0
