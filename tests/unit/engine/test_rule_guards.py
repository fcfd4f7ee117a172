"""Safety rules the engine keeps whatever else the node allows, on the virtual clock (harness.py):
results count only under their attempt's fence, a failure is run again only if nothing it ran can
repeat a side effect, a stopped device is given no work, and a command a person denied is never
run again, not even by a node whose retry policy and idempotent command would otherwise allow it."""

from __future__ import annotations

from device_agent.approvals import refused
from device_agent.ledger import Approval
from orchestrator.domain.model import AdminState
from orchestrator.engine.records import DecideApproval, FrameIn
from protocol.errors import ErrorCode
from protocol.messages import ApprovalDecision, ApprovalRequest, CommandBatch, Error, ErrorInfo, Result, ResultBatch
from tests.unit.engine.harness import Harness, accepted, one_node, results

# Tries left and a command its submitter vouched for: only the rule under test stops a rerun.
RETRIED = {
    "nodes": [
        {
            "id": "n",
            "commands": [{"tool": "sim.act", "idempotent": True}],
            "retry": {"max_attempts": 3, "backoff_s": 1, "backoff_max_s": 1},
        }
    ]
}


async def set_admin(h: Harness, device_id: str, admin: AdminState) -> None:
    """What `POST /v1/devices/{id}/stop` (or `/resume`) asks of the engine, the one writer."""
    action = {AdminState.STOPPED: "stop", AdminState.ACTIVE: "resume"}[admin]
    assert (await h.control(device_id, action))["ok"]


# ---------------------------------------------------------------- fences


async def test_results_under_an_older_fence_than_their_attempts_are_refused_and_not_applied(h: Harness) -> None:
    dev = await h.enroll("desk")
    await h.connect(dev)
    await h.submit(one_node())
    (earlier,) = h.batches(dev)
    await h.step(accepted(dev, earlier), results(dev, earlier))
    task = await h.submit(one_node())  # its attempt gets the device's next fence
    batch = h.batches(dev)[-1]
    assert batch.fence > earlier.fence
    await h.step(accepted(dev, batch))
    older = results(dev, batch)
    assert isinstance(older.message, ResultBatch)
    older.message = older.message.model_copy(update={"fence": earlier.fence})
    await h.step(older)
    refusals = [s.message for s in h.links.sent if isinstance(s.message, Error) and s.device_id == dev]
    assert [e.code for e in refusals] == [ErrorCode.STALE_FENCE]
    assert (await h.task(task))["nodes"] == {"n": "running"}  # the attempt is still open, unchanged
    await h.step(results(dev, batch))  # under its own fence
    assert (await h.task(task))["state"] == "succeeded"


# ---------------------------------------------------------------- retry safety


async def test_a_failure_after_a_read_only_command_and_an_action_ran_is_not_run_again(h: Harness) -> None:
    dev = await h.enroll("desk")
    await h.connect(dev)
    look_then_act = {"commands": [{"tool": "sim.look"}, {"tool": "sim.act"}], "retry": {"max_attempts": 3}}
    task = await h.submit({"nodes": [{"id": "n", **look_then_act}]})
    (batch,) = h.batches(dev)
    look, act = batch.commands
    ran = [
        Result(call_id=look.call_id, status="success", result={"seen": 1}),
        Result(call_id=act.call_id, status="failure", error=ErrorInfo(code="tool_error", message="half done")),
    ]
    await h.step(
        accepted(dev, batch), FrameIn(dev, ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=ran))
    )
    for _ in range(5):  # well past every backoff the retry policy would wait
        await h.advance(2)
    state = await h.task(task)
    assert state["state"] == "failed" and state["errors"] == {"n": "tool_error"}
    assert h.batches(dev) == [batch]  # sim.act is neither read-only nor idempotent: never sent again


# ---------------------------------------------------------------- emergency stop


async def test_a_stopped_device_is_given_no_work_until_it_is_resumed(h: Harness) -> None:
    dev = await h.enroll("desk")
    await h.connect(dev)
    await set_admin(h, dev, AdminState.STOPPED)
    task = await h.submit(one_node())
    await h.advance(1)
    assert h.batches(dev) == []
    assert (await h.task(task))["nodes"] == {"n": "ready"}  # waiting for a device in service
    await set_admin(h, dev, AdminState.ACTIVE)
    (batch,) = h.batches(dev)  # the same node, once the stop is lifted
    await h.step(accepted(dev, batch), results(dev, batch))
    assert (await h.task(task))["state"] == "succeeded"


async def test_work_goes_past_a_stopped_device_to_one_in_service(h: Harness) -> None:
    stopped = await h.enroll("a-stopped")  # first in id order: placement would try it first
    serving = await h.enroll("b-serving")
    for dev in (stopped, serving):
        await h.connect(dev)
    await set_admin(h, stopped, AdminState.STOPPED)
    await h.submit(one_node("first"))
    await h.submit(one_node("second"))  # queued behind the first on the busy device
    assert len(h.batches(serving)) == 1
    await h.advance(1)  # a free stopped device must not take the queued node either
    assert h.batches(stopped) == []
    first = h.batches(serving)[0]
    await h.step(accepted(serving, first), results(serving, first))
    assert len(h.batches(serving)) == 2 and h.batches(stopped) == []


# ---------------------------------------------------------------- approvals


def approval_request(dev: str, batch: CommandBatch) -> FrameIn:
    cmd = batch.commands[0]
    request = ApprovalRequest(
        approval_id="apr_1", batch_id=batch.batch_id, call_id=cmd.call_id, tool=cmd.tool, arguments={}
    )
    return FrameIn(dev, request)


def denied_result(dev: str, batch: CommandBatch) -> FrameIn:
    """The result the agent sends for a denied command (device_agent.approvals.refused)."""
    cmd = batch.commands[0]
    rec = Approval(
        approval_id="apr_1",
        batch_id=batch.batch_id,
        call_id=cmd.call_id,
        tool=cmd.tool,
        arguments={},
        reason="",
        local_only=False,
        created_at=0.0,
        state="denied",
        decided_by="operator",
    )
    result = refused(cmd, rec)
    assert result is not None
    return FrameIn(dev, ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=[result]))


async def test_a_denied_command_fails_its_node_for_good_despite_tries_left(h: Harness) -> None:
    dev = await h.enroll("desk")
    await h.connect(dev)
    task = await h.submit(RETRIED)
    (batch,) = h.batches(dev)
    await h.step(accepted(dev, batch), approval_request(dev, batch))
    (asked,) = await h.step(DecideApproval("apr_1", "denied", "operator", "not on a Friday"))
    assert asked["ok"] is True
    sent = [s.message for s in h.links.sent if isinstance(s.message, ApprovalDecision)]
    assert [m.decision for m in sent] == ["denied"]
    confirmed = ApprovalDecision(approval_id="apr_1", decision="denied", by="operator", reason="not on a Friday")
    await h.step(FrameIn(dev, confirmed))  # the device's ledger took it and says so
    await h.step(denied_result(dev, batch))
    for _ in range(5):  # well past every backoff the retry policy would wait
        await h.advance(2)
    state = await h.task(task)
    assert state["state"] == "failed" and state["errors"] == {"n": "approval_denied"}
    assert h.batches(dev) == [batch]  # never sent again
