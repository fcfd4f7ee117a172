"""Takeovers in the real engine on a virtual clock: a person has the device, its agent node pauses
before its next action (its clock stopped), the model is told at the handback and nothing of the
step it asked for meanwhile runs; the device takes no new work; a stop ends a takeover; the
owner's takeover at the device does the same; a model's question is answered by the handback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.domain.model import Liveness
from orchestrator.engine.records import AgentDone, AgentStep, DeviceHello, FrameIn, ToolCall
from protocol.messages import (
    FEATURES,
    ApprovalDecision,
    ApprovalRequest,
    DeviceControl,
    Hello,
    OwnerTakeover,
    OwnerTakeoverState,
    RecordingEnd,
)
from tests.unit.engine.harness import TOOLS, Harness, results, tool

GUI = [*TOOLS, tool("gui.click"), tool("approval.ask_person", read_only=True)]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = await (await asyncio.to_thread(Harness, tmp_path)).open(planner=True)
    try:
        yield harness
    finally:
        await harness.close()


async def screen_device(h: Harness, name: str = "desk") -> str:
    """A device whose agent announced a live view and recordings (a GUI device)."""
    dev = await h.enroll(name)
    epoch = await h.store.open_session(dev)
    hello = Hello(device_id=dev, versions=[1], info={"platform": "linux"}, tools=GUI, features=list(FEATURES))  # type: ignore[arg-type]
    await h.step(DeviceHello(dev, hello, False, epoch, "A"))
    return dev


async def agent_node(h: Harness, timeout_s: float = 60.0, **extra: Any) -> tuple[str, str]:
    task = await h.submit(
        {
            "nodes": [
                {
                    "id": "a",
                    "kind": "agent",
                    "instruction": "book it",
                    "timeout_s": timeout_s,
                    "retry": {"max_attempts": 1},
                    **extra,
                }
            ]
        }
    )
    assert h.planner is not None
    return task, h.planner.agents[-1]


async def node_state(h: Harness, task: str, node: str = "a") -> str:
    state: str = (await h.task(task))["nodes"][node]
    return state


async def node_error(h: Harness, task: str, node: str = "a") -> str | None:
    code: str | None = (await h.task(task))["errors"][node]
    return code


async def one_step(h: Harness, dev: str, attempt: str) -> None:
    """The agent runs one step on its device (so its attempt has started: it is not re-placed)."""
    (waiter,) = await h.step(AgentStep(attempt, [ToolCall("sim.act", {})]))
    await h.step(results(dev, h.batches(dev)[-1]))
    assert (await waiter)[0]["status"] == "success"


async def wait(h: Harness, dev: str, seconds: float) -> None:
    """Let time pass while the device stays connected (its replica reports it online)."""
    epoch = h.engine.devices[dev].epoch
    await h.live(seconds, "A", (dev, epoch, Liveness.ONLINE, 0.0, None))


def controls(h: Harness, dev: str) -> list[DeviceControl]:
    return [s.message for s in h.links.sent if s.device_id == dev and isinstance(s.message, DeviceControl)]


async def test_a_takeover_pauses_the_agent_node_before_its_next_step_and_the_handback_tells_the_model(
    h: Harness,
) -> None:
    dev = await screen_device(h)
    task, attempt = await agent_node(h)
    (waiter,) = await h.step(AgentStep(attempt, [ToolCall("sim.look", {})]))
    (first,) = h.batches(dev)
    await h.step(results(dev, first))
    assert (await waiter)[0]["status"] == "success"

    reply = await h.control(dev, "takeover", "a CAPTCHA", by="ada")
    assert reply["ok"] and reply["changed"]
    assert controls(h, dev)[-1].control.taken_over and controls(h, dev)[-1].control.takeover_by == "ada"
    assert await node_state(h, task) == "taken_over"

    (held,) = await h.step(AgentStep(attempt, [ToolCall("gui.click", {"x": 1}), ToolCall("sim.look", {})]))
    assert len(h.batches(dev)) == 1, "a step asked for while a person has the device is not sent"
    assert not held.done()

    await wait(h, dev, 30.0)
    await h.control(dev, "handback", "typed the code", by="ada")
    told = await held
    assert [r["status"] for r in told] == ["skipped", "skipped"]
    assert {r["error"]["code"] for r in told} == {"taken_over"}
    message = told[0]["error"]["message"]
    assert "typed the code" in message and "ada" in message and "observe" in message
    assert len(h.batches(dev)) == 1, "nothing of the held step ran"
    assert await node_state(h, task) == "running"

    (after,) = await h.step(AgentStep(attempt, [ToolCall("sim.look", {})]))
    (_, second) = h.batches(dev)
    await h.step(results(dev, second))
    assert (await after)[0]["status"] == "success"


async def test_a_step_asked_after_the_handback_that_the_model_was_not_told_of_is_answered_first(
    h: Harness,
) -> None:
    dev = await screen_device(h)
    _, attempt = await agent_node(h)
    await h.control(dev, "takeover", by="ada")
    await h.control(dev, "handback", "closed the dialog", by="ada")
    (first,) = await h.step(AgentStep(attempt, [ToolCall("gui.click", {})]))
    assert "closed the dialog" in (await first)[0]["error"]["message"]
    assert h.batches(dev) == []
    (second,) = await h.step(AgentStep(attempt, [ToolCall("sim.look", {})]))
    assert len(h.batches(dev)) == 1 and not second.done(), "told once: the next step runs"


async def test_takeover_time_does_not_count_against_the_agent_nodes_timeout(h: Harness) -> None:
    dev = await screen_device(h)
    task, attempt = await agent_node(h, timeout_s=60.0)
    await one_step(h, dev, attempt)
    await wait(h, dev, 40.0)
    await h.control(dev, "takeover", by="ada")
    await wait(h, dev, 300.0)  # far past its deadline, all of it taken over
    assert await node_state(h, task) == "taken_over"
    await h.control(dev, "handback", by="ada")
    await wait(h, dev, 15.0)
    assert await node_state(h, task) == "running", "40 s used before, 15 s after: within 60 s"
    await wait(h, dev, 10.0)
    assert await node_error(h, task) == "timeout"


async def test_a_device_a_person_has_takes_no_new_work_until_the_handback(h: Harness) -> None:
    dev = await screen_device(h)
    await h.control(dev, "takeover", by="ada")
    task = await h.submit({"nodes": [{"id": "t", "commands": [{"tool": "sim.act"}]}]})
    await wait(h, dev, 5.0)
    assert h.batches(dev) == []
    assert await node_state(h, task, "t") in ("ready", "queued")
    await h.control(dev, "handback", by="ada")
    assert [b.node_id for b in h.batches(dev)] == ["t"]


async def test_a_stop_ends_a_takeover_and_a_takeover_of_a_stopped_device_is_refused(h: Harness) -> None:
    dev = await screen_device(h)
    task, attempt = await agent_node(h)
    await one_step(h, dev, attempt)
    await h.control(dev, "takeover", by="ada")
    (held,) = await h.step(AgentStep(attempt, [ToolCall("gui.click", {})]))
    await h.control(dev, "stop", "fire")
    with pytest.raises(asyncio.CancelledError):
        await held
    assert not controls(h, dev)[-1].control.taken_over
    assert await node_error(h, task) == "device_stopped"
    refused = await h.control(dev, "takeover", by="ada")
    assert refused == {"ok": False, "code": "conflict", "detail": refused["detail"]}
    assert "stopped" in refused["detail"]


async def test_a_device_taken_over_by_one_operator_is_refused_to_another(h: Harness) -> None:
    dev = await screen_device(h)
    assert (await h.control(dev, "takeover", by="ada"))["ok"]
    assert (await h.control(dev, "takeover", by="ada"))["changed"] is False
    other = await h.control(dev, "takeover", by="bob")
    assert other["ok"] is False and "ada" in other["detail"]


async def test_a_takeover_survives_an_engine_restart(h: Harness) -> None:
    dev = await screen_device(h)
    await h.control(dev, "takeover", "login", by="ada")
    await h.restart()
    assert h.engine.devices[dev].taken_over
    task = await h.submit({"nodes": [{"id": "t", "commands": [{"tool": "sim.act"}]}]})
    await wait(h, dev, 2.0)
    assert h.batches(dev) == []
    await h.control(dev, "handback", by="ada")
    assert [b.node_id for b in h.batches(dev)] == ["t"]
    assert task


async def test_the_owners_takeover_at_the_device_pauses_its_agent_node_like_an_operators(h: Harness) -> None:
    dev = await screen_device(h)
    task, attempt = await agent_node(h)
    owner = OwnerTakeoverState(taken_over=True, by="owner", gen=1)
    await h.step(FrameIn(dev, OwnerTakeover(state=owner)))
    assert await node_state(h, task) == "taken_over"
    assert (await h.device(dev)).control["owner_takeover"]["by"] == "owner"
    (held,) = await h.step(AgentStep(attempt, [ToolCall("gui.click", {})]))
    assert h.batches(dev) == []
    # An older report, delivered late, changes nothing.
    await h.step(FrameIn(dev, OwnerTakeover(state=OwnerTakeoverState(taken_over=False, gen=0))))
    assert not held.done()
    back = OwnerTakeoverState(taken_over=False, by="owner", note="signed in", gen=2)
    await h.step(FrameIn(dev, OwnerTakeover(state=back)))
    assert "signed in" in (await held)[0]["error"]["message"]
    assert await node_state(h, task) == "running"


async def test_a_models_question_to_a_person_is_answered_by_the_handback_note(h: Harness) -> None:
    dev = await screen_device(h)
    task, attempt = await agent_node(h)
    (asked,) = await h.step(AgentStep(attempt, [ToolCall("approval.ask_person", {"question": "the 2FA code?"})]))
    (step,) = h.batches(dev)
    request = ApprovalRequest(
        approval_id="apr_q1", batch_id=step.batch_id, call_id="c1", tool="approval.ask_person", reason="the 2FA code?"
    )
    await h.step(FrameIn(dev, request))
    assert await node_state(h, task) == "waiting_approval"
    await h.control(dev, "takeover", by="ada")
    assert await node_state(h, task) == "taken_over"
    await h.control(dev, "handback", "entered 123456", by="ada")
    assert await node_state(h, task) == "waiting_approval", "the device confirms the answer"
    asked_of_device = [
        s.message for s in h.links.sent if isinstance(s.message, ApprovalDecision) and s.device_id == dev
    ]
    assert (asked_of_device[-1].decision, asked_of_device[-1].reason) == ("approved", "entered 123456")
    await h.step(
        FrameIn(dev, ApprovalDecision(approval_id="apr_q1", decision="approved", by="ada", reason="entered 123456"))
    )
    assert await node_state(h, task) == "running"
    row = await h.store.find_approval("apr_q1")
    assert row is not None and row.state == "approved"
    await h.step(results(dev, step))
    assert (await asked)[0]["status"] == "success"
    # The model read the note as its answer: its next step runs, it is not told again.
    (after,) = await h.step(AgentStep(attempt, [ToolCall("sim.look", {})]))
    assert not after.done() and h.batches(dev)[-1].commands[0].tool == "sim.look"


async def test_a_failed_recorded_attempt_keeps_its_recording_and_a_successful_one_does_not(h: Harness) -> None:
    dev = await screen_device(h)
    ok = await h.submit({"nodes": [{"id": "g", "commands": [{"tool": "gui.click"}]}]})
    (batch,) = h.batches(dev)
    assert batch.record == "failures"
    await h.step(results(dev, batch))
    bad = await h.submit({"nodes": [{"id": "g", "commands": [{"tool": "gui.click"}], "retry": {"max_attempts": 1}}]})
    (_, failing) = h.batches(dev)
    await h.step(results(dev, failing, status="failure"))
    ends = [s.message for s in h.links.sent if isinstance(s.message, RecordingEnd)]
    assert [(e.task_id, e.keep) for e in ends] == [(ok, False), (bad, True)]
    plain = await h.submit({"nodes": [{"id": "s", "commands": [{"tool": "sim.act"}]}]})
    (quiet,) = [b for b in h.batches(dev) if b.task_id == plain]
    assert quiet.record == "off"
    await h.step(results(dev, quiet))
    always = await h.submit({"nodes": [{"id": "s", "commands": [{"tool": "sim.act"}], "record": "always"}]})
    (kept,) = [b for b in h.batches(dev) if b.task_id == always]
    assert kept.record == "always"
    await h.step(results(dev, kept))
    ends = [s.message for s in h.links.sent if isinstance(s.message, RecordingEnd)]
    assert [(e.task_id, e.keep) for e in ends][-1] == (always, True)
    assert plain not in [e.task_id for e in ends], "an attempt not recorded has no recording to end"


async def test_an_agent_node_ended_while_its_step_is_held_drops_the_step(h: Harness) -> None:
    dev = await screen_device(h)
    task, attempt = await agent_node(h)
    await one_step(h, dev, attempt)
    await h.control(dev, "takeover", by="ada")
    (held,) = await h.step(AgentStep(attempt, [ToolCall("gui.click", {})]))
    await h.step(AgentDone(attempt, False, error_code="agent_failed", error_message="gave up"))
    with pytest.raises(asyncio.CancelledError):
        await held
    assert await node_state(h, task) == "failed"
