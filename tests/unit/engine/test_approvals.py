"""Approvals in the engine (issue 18), step by step on a virtual clock (harness.py): who decides
first wins, a lost hint is found again, the wait does not count against the deadline, and a
restart or an ended attempt leaves nothing waiting for ever. Every order here is chosen by the
test, so each interleaving is tried exactly, not by chance."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.domain.model import Liveness
from orchestrator.engine.records import ApprovalDecided, CancelTask, FrameIn
from orchestrator.store import approvals as stored
from protocol.messages import ApprovalDecision, ApprovalRequest, CommandBatch, ErrorInfo, Result, ResultBatch
from tests.unit.engine.harness import Harness, accepted, one_node, results


def ask(dev: str, batch: CommandBatch, approval_id: str = "apr_1") -> FrameIn:
    cmd = batch.commands[0]
    return FrameIn(
        dev,
        ApprovalRequest(
            approval_id=approval_id, batch_id=batch.batch_id, call_id=cmd.call_id, tool=cmd.tool, arguments={}
        ),
    )


def refused_by(dev: str, batch: CommandBatch, code: str) -> FrameIn:
    res = [
        Result(call_id=c.call_id, status="failure", error=ErrorInfo(code=code, message=code)) for c in batch.commands
    ]
    return FrameIn(dev, ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=res))


def decisions(h: Harness, dev: str) -> list[tuple[str, str]]:
    return [
        (s.message.approval_id, s.message.decision)
        for s in h.links.sent
        if isinstance(s.message, ApprovalDecision) and s.device_id == dev
    ]


async def settle(h: Harness) -> None:
    """Let the decisions the engine writes after its commit land, then run the step they wake."""
    await h.engine.approvals.drain()
    items = []
    while not h.engine.inbox.empty():
        items.append(h.engine.inbox.get_nowait())
    await h.step(*items)


async def decide(h: Harness, approval_id: str, state: str) -> bool:
    return await stored.decide(h.store, approval_id, state, "operator", "", datetime.fromtimestamp(h.clock.now, UTC))


async def waiting(h: Harness, timeout_s: float = 60) -> tuple[str, str, CommandBatch]:
    dev = await h.enroll("desk")
    _, h.epoch = await h.connect(dev)  # type: ignore[attr-defined]
    task = await h.submit(one_node(timeout_s=timeout_s))
    (batch,) = h.batches(dev)
    await h.step(accepted(dev, batch))
    await h.step(ask(dev, batch))
    assert (await h.task(task))["nodes"] == {"n": "waiting_approval"}
    return dev, task, batch


async def test_the_first_decision_wins_over_the_expiry(tmp_path: Path) -> None:
    h = await (await asyncio.to_thread(Harness, tmp_path, approval_timeout_s=30)).open()
    try:
        dev, task, batch = await waiting(h)
        assert await decide(h, "apr_1", "approved")  # an operator, just before the expiry...
        await h.live(31, "A", (dev, h.epoch, Liveness.ONLINE, 0.0, batch.batch_id))  # type: ignore[attr-defined]
        # ...the expiry fires: it finds the approval decided and must not overturn it
        await settle(h)
        await h.step(ApprovalDecided("apr_1"))  # the operator's hint arrives late
        assert (await stored.get(h.store, "apr_1")).state == "approved"  # type: ignore[union-attr]
        assert set(decisions(h, dev)) == {("apr_1", "approved")}
        assert (await h.task(task))["nodes"] == {"n": "running"}
        await h.step(results(dev, batch))
        assert (await h.task(task))["state"] == "succeeded"
    finally:
        await h.close()


async def test_the_expiry_wins_over_a_late_approval(tmp_path: Path) -> None:
    h = await (await asyncio.to_thread(Harness, tmp_path, approval_timeout_s=30)).open()
    try:
        dev, task, batch = await waiting(h)
        await h.live(31, "A", (dev, h.epoch, Liveness.ONLINE, 0.0, batch.batch_id))  # type: ignore[attr-defined]
        await settle(h)
        assert not await decide(h, "apr_1", "approved")  # too late: the API answers 409
        assert decisions(h, dev) == [("apr_1", "expired")]
        await h.step(refused_by(dev, batch, "approval_timeout"))
        state = await h.task(task)
        assert state["state"] == "failed" and state["errors"] == {"n": "approval_timeout"}
    finally:
        await h.close()


async def test_a_lost_decision_hint_is_found_by_the_reconcile(h: Harness) -> None:
    dev, task, _batch = await waiting(h)
    assert await decide(h, "apr_1", "denied")  # decided on another replica; its hint is lost
    await h.advance(h.settings.reconcile_interval_s + 0.1)
    assert decisions(h, dev) == [("apr_1", "denied")]
    assert (await h.task(task))["nodes"] == {"n": "running"}


async def test_the_wait_does_not_count_against_the_deadline(h: Harness) -> None:
    dev, task, batch = await waiting(h, timeout_s=10)
    link = (dev, h.epoch, Liveness.ONLINE, 0.0, batch.batch_id)  # type: ignore[attr-defined]
    await h.live(50, "A", link)  # far past the node's timeout_s while a person thinks
    assert (await h.task(task))["nodes"] == {"n": "waiting_approval"}
    await h.restart()  # and the orchestrator restarts meanwhile
    await h.connect(dev, resumed=True)
    await h.live(50, "A", (dev, h.epoch + 1, Liveness.ONLINE, 0.0, batch.batch_id))  # type: ignore[attr-defined]
    assert (await h.task(task))["nodes"] == {"n": "waiting_approval"}
    assert await decide(h, "apr_1", "approved")
    await h.step(ApprovalDecided("apr_1"))
    sent = [s.message for s in h.links.sent if isinstance(s.message, ApprovalDecision)]
    assert [m.decision for m in sent] == ["approved"]
    assert sent[0].deadline is not None and sent[0].deadline.timestamp() > h.clock.now + 9  # its time left
    await h.live(5, "A", (dev, h.epoch + 1, Liveness.ONLINE, 0.0, batch.batch_id))  # type: ignore[attr-defined]
    assert (await h.task(task))["nodes"] == {"n": "running"}  # not timed out: it has its time left
    await h.live(40, "A", (dev, h.epoch + 1, Liveness.ONLINE, 0.0, batch.batch_id))  # type: ignore[attr-defined]
    state = await h.task(task)
    assert state["state"] == "failed" and state["errors"] == {"n": "timeout"}  # and then no more


async def test_asking_again_is_one_approval_and_a_decided_one_is_answered(h: Harness) -> None:
    dev, task, batch = await waiting(h)
    await h.step(ask(dev, batch))  # the agent reconnected and asks again
    page, _ = await stored.page(h.store, None, task, 10, None)
    assert [a.id for a in page] == ["apr_1"]
    assert await decide(h, "apr_1", "approved")
    await h.step(ApprovalDecided("apr_1"))
    await h.step(ask(dev, batch))  # asked again after the decision (the answer was lost)
    assert decisions(h, dev) == [("apr_1", "approved"), ("apr_1", "approved")]


async def test_an_ended_attempt_cancels_its_approval(h: Harness) -> None:
    dev, task, batch = await waiting(h)
    await h.step(CancelTask(task))
    assert (await stored.get(h.store, "apr_1")).state == "pending"  # type: ignore[union-attr]
    await h.step(refused_by(dev, batch, "cancelled"))  # the agent stopped waiting: nothing ran
    await settle(h)
    assert (await stored.get(h.store, "apr_1")).state == "cancelled"  # type: ignore[union-attr]
    assert h.engine.approvals.waiting == {}


async def test_a_request_for_a_batch_that_is_not_the_devices_is_answered_cancelled(h: Harness) -> None:
    _dev, _task, batch = await waiting(h)
    other = await h.enroll("other")
    await h.connect(other)
    await h.step(ask(other, batch, "apr_x"))
    assert await stored.get(h.store, "apr_x") is None
    assert decisions(h, other) == [("apr_x", "cancelled")]


@pytest.mark.parametrize("decision", ["approved", "denied"])
async def test_a_decision_given_at_the_device_is_recorded(h: Harness, decision: str) -> None:
    dev, task, _batch = await waiting(h)
    report = ApprovalDecision(approval_id="apr_1", decision=decision, by="owner alice")  # type: ignore[arg-type]
    await h.step(FrameIn(dev, report))
    row = await stored.get(h.store, "apr_1")
    assert row is not None and row.state == decision and "at the device" in (row.decided_by or "")
    assert (await h.task(task))["nodes"] == {"n": "running"}
