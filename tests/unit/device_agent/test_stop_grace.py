"""An emergency stop cancels a command that does not return within STOP_GRACE_S of it (one whose
work no process kill can end, e.g. a tool waiting in the agent's own process), and the command
ends `device_stopped`; a command that returns in time keeps its own result."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from device_agent import agent as agent_module
from device_agent.config import AgentConfig
from device_agent.runner import build
from protocol.messages import Command, CommandBatch, ControlState, Result


def batch() -> CommandBatch:
    cmd = Command(call_id="c1", tool="system.echo", arguments={})
    return CommandBatch(batch_id="b1", task_id="t1", node_id="n1", attempt=1, fence=1, commands=[cmd])


async def test_a_command_still_running_after_the_grace_is_cancelled_and_ends_device_stopped(
    tmp_path: Path,
) -> None:
    agent = build(AgentConfig(server="http://127.0.0.1:9", token="orrd_dev_x.secret", data_dir=tmp_path))
    agent_module.STOP_GRACE_S = 0.2  # type: ignore[misc]
    never = asyncio.Event()

    async def hangs(*_args: object, **_kw: object) -> Result:
        await never.wait()
        raise AssertionError("unreachable")

    agent.router.call = hangs  # type: ignore[method-assign]
    b = batch()
    try:
        running = asyncio.ensure_future(agent._call(b.commands[0], b))
        await asyncio.sleep(0)
        started = time.monotonic()
        await agent._apply_control(ControlState(gen=1, stopped=True, reason="runaway"))
        result = await asyncio.wait_for(running, 5)
        assert time.monotonic() - started < 4
        assert result.status == "failure" and result.error is not None
        assert result.error.code == "device_stopped" and "runaway" in result.error.message
    finally:
        agent_module.STOP_GRACE_S = 2.0  # type: ignore[misc]
        agent.ledger.close()
        agent.router.audit.close()


async def test_cancelling_the_agent_itself_still_cancels_the_command(tmp_path: Path) -> None:
    agent = build(AgentConfig(server="http://127.0.0.1:9", token="orrd_dev_y.secret", data_dir=tmp_path))
    gone, started = asyncio.Event(), asyncio.Event()

    async def hangs(*_args: object, **_kw: object) -> Result:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            gone.set()
        raise AssertionError("unreachable")

    agent.router.call = hangs  # type: ignore[method-assign]
    b = batch()
    try:
        running = asyncio.ensure_future(agent._call(b.commands[0], b))
        await asyncio.wait_for(started.wait(), 5)
        running.cancel()
        await asyncio.wait_for(gone.wait(), 5)  # the call went with it, not left running
        assert running.cancelled()
    finally:
        agent.ledger.close()
        agent.router.audit.close()


async def test_a_command_that_takes_the_halt_and_returns_leaves_its_task_able_to_wait_again(
    tmp_path: Path,
) -> None:
    """The call runs in the executor's own task, which the grace cancels; a tool that catches the
    cancellation and returns keeps its result, and the task is not left marked as cancelling (its
    next wait, here a timeout, must behave as any other)."""
    agent = build(AgentConfig(server="http://127.0.0.1:9", token="orrd_dev_z.secret", data_dir=tmp_path))
    agent_module.STOP_GRACE_S = 0.2  # type: ignore[misc]
    kept = Result(call_id="c1", status="success", result={"kept": True})

    async def shrugs(*_args: object, **_kw: object) -> Result:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return kept  # a tool that cleans up and answers instead of raising
        raise AssertionError("unreachable")

    agent.router.call = shrugs  # type: ignore[method-assign]
    b = batch()

    async def executor() -> tuple[Result, bool]:
        result = await agent._call(b.commands[0], b)
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        try:
            async with asyncio.timeout(0.05):
                await asyncio.Event().wait()
        except TimeoutError:
            return result, cancelling == 0
        return result, False

    try:
        running = asyncio.ensure_future(executor())
        await asyncio.sleep(0)
        await agent._apply_control(ControlState(gen=1, stopped=True, reason="runaway"))
        result, clean = await asyncio.wait_for(running, 5)
        assert result == kept
        assert clean
    finally:
        agent_module.STOP_GRACE_S = 2.0  # type: ignore[misc]
        agent.ledger.close()
        agent.router.audit.close()
