"""Approvals in the engine, step by step on a virtual clock (harness.py). The device's ledger is
the one arbiter: an operator's decision, the expiry and the end of an attempt are requests sent
to the device until it confirms; the store records only the decision the device reports, and
with it, in the same step, what the decision does. Every order here is chosen by the test, so
each interleaving is tried exactly, not by chance."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from orchestrator.domain.model import Liveness
from orchestrator.engine.records import CancelTask, DecideApproval, FrameIn
from orchestrator.store import approvals as stored
from orchestrator.store.models import Approval
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


def confirm(dev: str, decision: str, by: str = "operator", approval_id: str = "apr_1", **kw: Any) -> FrameIn:
    """The device reports the decision that holds in its ledger."""
    return FrameIn(dev, ApprovalDecision(approval_id=approval_id, decision=decision, by=by, **kw))  # type: ignore[arg-type]


def refused_by(dev: str, batch: CommandBatch, code: str) -> FrameIn:
    res = [
        Result(call_id=c.call_id, status="failure", error=ErrorInfo(code=code, message=code)) for c in batch.commands
    ]
    return FrameIn(dev, ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=res))


def asked_of(h: Harness, dev: str) -> list[tuple[str, str]]:
    """The decisions the engine asked of the device, in order."""
    return [
        (s.message.approval_id, s.message.decision)
        for s in h.links.sent
        if isinstance(s.message, ApprovalDecision) and s.device_id == dev
    ]


async def row(h: Harness, approval_id: str = "apr_1") -> Approval:
    found = await stored.get(h.store, approval_id)
    assert found is not None
    return found


async def decide(h: Harness, decision: str, by: str = "api key k1", approval_id: str = "apr_1") -> dict[str, Any]:
    (reply,) = await h.step(DecideApproval(approval_id, decision, by))
    assert isinstance(reply, dict)
    return reply


async def waiting(
    h: Harness, timeout_s: float = 60, tool_name: str = "sim.act", **node: Any
) -> tuple[str, str, CommandBatch]:
    dev = await h.enroll("desk")
    _, h.epoch = await h.connect(dev)  # type: ignore[attr-defined]
    task = await h.submit(one_node(tool_name=tool_name, timeout_s=timeout_s, **node))
    (batch,) = h.batches(dev)
    await h.step(accepted(dev, batch))
    await h.step(ask(dev, batch))
    assert (await h.task(task))["nodes"] == {"n": "waiting_approval"}
    return dev, task, batch


def running(h: Harness, dev: str, batch: CommandBatch) -> tuple[str, int, Liveness, float, str | None]:
    """The device's link as its replica reports it: online, running `batch`."""
    return (dev, h.epoch, Liveness.ONLINE, 0.0, batch.batch_id)  # type: ignore[attr-defined]


async def test_an_operators_decision_is_asked_of_the_device_and_holds_only_once_it_confirms(h: Harness) -> None:
    dev, task, batch = await waiting(h)
    assert await decide(h, "approved") == {"ok": True, "online": True}
    stored_row = await row(h)
    assert (stored_row.state, stored_row.requested_state) == ("pending", "approved")  # asked, not decided
    assert asked_of(h, dev) == [("apr_1", "approved")]
    assert (await h.task(task))["nodes"] == {"n": "waiting_approval"}
    await h.step(confirm(dev, "approved", by="api key k1"))
    assert ((await row(h)).state, (await row(h)).decided_by) == ("approved", "api key k1")
    assert (await h.task(task))["nodes"] == {"n": "running"}
    await h.step(results(dev, batch))
    assert (await h.task(task))["state"] == "succeeded"


async def test_the_owner_approving_at_the_device_holds_over_an_operators_denial(h: Harness) -> None:
    """Two deciders, one truth: the operator's deny reaches a ledger the owner approved first;
    the device reports what holds, and the store says approved (the command runs)."""
    dev, task, _batch = await waiting(h)
    assert (await decide(h, "denied"))["ok"]
    await h.step(confirm(dev, "approved", by="device owner alice (at the device)"))
    assert (await row(h)).state == "approved"
    assert (await h.task(task))["nodes"] == {"n": "running"}
    assert await decide(h, "denied", by="api key k2") == {
        "ok": False,
        "code": "conflict",
        "detail": "approval 'apr_1' is decided already",
    }


async def test_a_second_operator_decision_while_the_first_is_on_its_way_is_refused(h: Harness) -> None:
    dev, _task, _batch = await waiting(h)
    assert (await decide(h, "approved", by="api key k1"))["ok"]
    assert (await decide(h, "approved", by="api key k1"))["ok"]  # asked again: the same answer
    other = await decide(h, "denied", by="api key k2")
    assert other["ok"] is False and other["code"] == "conflict" and "approved" in other["detail"]
    assert asked_of(h, dev) == [("apr_1", "approved")]
    assert (await row(h)).requested_state == "approved"


async def test_an_approval_after_its_task_was_cancelled_is_refused_and_the_device_asked_to_cancel(
    h: Harness,
) -> None:
    """Cancel, then approve 50-100 ms later: the approval cannot run the command of a cancelled
    attempt; the device is asked to cancel the wait and the node ends cancelled."""
    dev, task, batch = await waiting(h)
    await h.step(CancelTask(task))
    reply = await decide(h, "approved")
    assert reply["ok"] is False and reply["code"] == "conflict" and "cancelled" in reply["detail"]
    assert ("apr_1", "approved") not in asked_of(h, dev)
    await h.step(confirm(dev, "cancelled", by="orchestrator"))
    await h.step(refused_by(dev, batch, "cancelled"))
    assert (await row(h)).state == "cancelled"
    state = await h.task(task)
    assert state["state"] == "cancelled" and state["nodes"] == {"n": "cancelled"}


async def test_the_expiry_is_asked_again_until_the_device_confirms_it(tmp_path: Path) -> None:
    h = await (await asyncio.to_thread(Harness, tmp_path, approval_timeout_s=30)).open()
    try:
        dev, task, batch = await waiting(h)
        await h.live(31, "A", running(h, dev, batch))  # expired; its request lost on the way
        assert (await row(h)).requested_state == "expired"
        first = len(asked_of(h, dev))
        await h.live(10, "A", running(h, dev, batch))  # the device still waits: asked again
        assert len(asked_of(h, dev)) > first and set(asked_of(h, dev)) == {("apr_1", "expired")}
        assert (await row(h)).state == "pending"  # never recorded before the device says so
        await h.step(confirm(dev, "expired", by="orchestrator"))
        await h.step(refused_by(dev, batch, "approval_timeout"))
        state = await h.task(task)
        assert (await row(h)).state == "expired"
        assert state["state"] == "failed" and state["errors"] == {"n": "approval_timeout"}
    finally:
        await h.close()


async def test_a_request_not_yet_confirmed_survives_a_restart_and_goes_again(h: Harness) -> None:
    dev, _task, _batch = await waiting(h)
    assert (await decide(h, "denied"))["ok"]
    sent = len(asked_of(h, dev))
    await h.restart()
    await h.connect(dev, resumed=True)
    assert asked_of(h, dev)[sent:] == [("apr_1", "denied")]  # the new engine asks it again
    await h.step(confirm(dev, "denied", by="api key k1"))
    assert (await row(h)).state == "denied"


async def test_a_denial_confirmed_just_before_a_restart_is_final(h: Harness) -> None:
    """A denial is recorded in the step that acts on it: a restart right after finds the node
    running again (waiting for the device's refusal), never placed anew."""
    dev, task, batch = await waiting(h, retry={"max_attempts": 3})
    await h.step(confirm(dev, "denied", by="device owner (at the device)"))
    await h.restart()
    await h.connect(dev, resumed=True)
    assert (await h.task(task))["nodes"] == {"n": "running"}
    await h.step(refused_by(dev, batch, "approval_denied"))
    state = await h.task(task)
    assert state["state"] == "failed" and state["errors"] == {"n": "approval_denied"}
    assert len(state["attempts"]) == 1 and {b.batch_id for b in h.batches(dev)} == {batch.batch_id}  # not retried


async def test_a_decision_for_an_attempt_no_longer_current_wakes_nothing(h: Harness) -> None:
    """The first attempt's approval is confirmed after that attempt was given up and the node's
    next attempt waits for an approval of its own: the late decision must not wake it."""
    dev, task, first = await waiting(h, tool_name="sim.look", retry={"max_attempts": 2, "backoff_s": 0})
    await h.step(refused_by(dev, first, "tool_error"))  # the attempt ends; a read-only node runs again
    await h.advance(0.1)
    second = h.batches(dev)[-1]
    assert second.batch_id != first.batch_id
    await h.step(accepted(dev, second), ask(dev, second, "apr_2"))
    await h.step(confirm(dev, "approved", by="device owner (at the device)"))  # apr_1, late
    assert (await row(h)).state == "approved"
    assert (await h.task(task))["nodes"] == {"n": "waiting_approval"}  # apr_2 still waits
    assert (await row(h, "apr_2")).state == "pending"


async def test_the_wait_does_not_count_against_the_deadline_and_the_devices_measure_is_kept(h: Harness) -> None:
    dev, task, batch = await waiting(h, timeout_s=10)
    await h.live(50, "A", running(h, dev, batch))  # far past the node's timeout_s while a person thinks
    assert (await h.task(task))["nodes"] == {"n": "waiting_approval"}
    await h.restart()  # and the orchestrator restarts meanwhile
    await h.connect(dev, resumed=True)
    await h.live(50, "A", (dev, h.epoch + 1, Liveness.ONLINE, 0.0, batch.batch_id))  # type: ignore[attr-defined]
    assert (await h.task(task))["nodes"] == {"n": "waiting_approval"}
    # The owner approves at the device; its own measure of the wait gives a later deadline.
    assert batch.deadline is not None
    moved = batch.deadline.timestamp() + 120
    await h.step(confirm(dev, "approved", by="owner (at the device)", deadline=_at(moved)))
    await h.live(15, "A", (dev, h.epoch + 1, Liveness.ONLINE, 0.0, batch.batch_id))  # type: ignore[attr-defined]
    assert (await h.task(task))["nodes"] == {"n": "running"}  # not timed out: it has its time left
    (stored_attempt,) = (await h.store.get_task(task)).attempts  # type: ignore[union-attr]
    assert stored_attempt.deadline is not None and stored_attempt.deadline.timestamp() >= moved
    await h.live(130, "A", (dev, h.epoch + 1, Liveness.ONLINE, 0.0, batch.batch_id))  # type: ignore[attr-defined]
    state = await h.task(task)
    assert state["state"] == "failed" and state["errors"] == {"n": "timeout"}  # and then no more


async def test_asking_again_is_one_approval_and_a_confirmed_one_is_answered_with_its_decision(h: Harness) -> None:
    dev, task, batch = await waiting(h)
    await h.step(ask(dev, batch))  # the agent reconnected and asks again
    page, _ = await stored.page(h.store, None, task, 10, None)
    assert [a.id for a in page] == ["apr_1"]
    await h.step(confirm(dev, "approved", by="owner (at the device)"))
    await h.step(confirm(dev, "approved", by="owner (at the device)"))  # reported again: once recorded
    await h.step(ask(dev, batch))  # its ledger forgot: only the decision that held may be taken
    assert asked_of(h, dev) == [("apr_1", "approved")]


async def test_an_ended_attempt_asks_its_device_to_cancel_the_wait(h: Harness) -> None:
    dev, task, batch = await waiting(h)
    assert (await decide(h, "approved"))["ok"]  # on its way when the task is cancelled
    await h.step(CancelTask(task))
    await h.step(refused_by(dev, batch, "cancelled"))  # the agent stopped waiting: nothing ran
    assert asked_of(h, dev) == [("apr_1", "approved"), ("apr_1", "cancelled")]
    assert ((await row(h)).state, (await row(h)).requested_state) == ("pending", "cancelled")
    await h.step(confirm(dev, "cancelled", by="orchestrator"))
    assert (await row(h)).state == "cancelled"
    assert h.engine.approvals.waiting == {}


async def test_a_request_for_a_batch_that_is_not_the_devices_is_answered_cancelled(h: Harness) -> None:
    _dev, _task, batch = await waiting(h)
    other = await h.enroll("other")
    await h.connect(other)
    await h.step(ask(other, batch, "apr_x"))
    assert await stored.get(h.store, "apr_x") is None
    assert asked_of(h, other) == [("apr_x", "cancelled")]
    await h.step(confirm(other, "approved", approval_id="apr_1"))  # nor may it report on another's
    assert (await row(h)).state == "pending"


async def test_an_operator_cannot_decide_an_approval_its_owner_keeps_for_the_device(h: Harness) -> None:
    dev = await h.enroll("desk")
    _, h.epoch = await h.connect(dev)  # type: ignore[attr-defined]
    await h.submit(one_node())
    (batch,) = h.batches(dev)
    cmd = batch.commands[0]
    request = ApprovalRequest(
        approval_id="apr_1", batch_id=batch.batch_id, call_id=cmd.call_id, tool=cmd.tool, local_only=True
    )
    await h.step(FrameIn(dev, request))
    reply = await decide(h, "approved")
    assert reply["ok"] is False and reply["code"] == "approval_local_only"
    assert asked_of(h, dev) == []


def _at(ts: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC)


@pytest.mark.parametrize("restart", [False, True])
async def test_an_attempt_whose_approval_was_denied_ends_refused_however_it_ends(h: Harness, restart: bool) -> None:
    """The device confirmed a denial, then it was lost before its refusal came back (the attempt
    ends `device_lost`, which a read-only node would retry): the node fails `approval_denied`,
    never placed again, also when the engine restarted in between."""
    dev, task, batch = await waiting(h, tool_name="sim.look", retry={"max_attempts": 3})
    await h.step(confirm(dev, "denied", by="device owner (at the device)"))
    if restart:
        await h.restart()
    await h.live(2 * h.settings.heartbeat_timeout_s, "A")  # nobody reports the device: it is lost
    state = await h.task(task)
    assert state["state"] == "failed" and state["errors"] == {"n": "approval_denied"}, state
    assert {b.batch_id for b in h.batches(dev)} == {batch.batch_id}
