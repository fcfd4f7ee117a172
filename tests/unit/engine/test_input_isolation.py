"""One input whose changes the store refuses (text it cannot hold) is left out of its step and
refused to its caller; the other inputs of the same step commit, and the engine goes on. A store
out of reach still fails the step as before (retried, then propagated: the engine stops).

The poison is real, not mocked: a lone surrogate, which SQLite's driver cannot encode (Postgres
refuses it and NUL the same way, as SQLSTATE 22xxx). Frames are built in-process here, past the
protocol's own check of device text (`protocol.text`), which is what this layer must survive."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from orchestrator.engine.records import FrameIn, Input
from orchestrator.engine.writer import COMMIT_ATTEMPTS, refused_data
from orchestrator.store import approvals as stored
from orchestrator.store.repo import ChangeSet, LeaseLost
from protocol.messages import ApprovalRequest, CommandBatch, Result, ResultBatch
from tests.unit.engine.harness import Harness, accepted, one_node, results

POISON = "a lone surrogate: \ud800"


def ask(dev: str, batch: CommandBatch, approval_id: str, reason: str) -> FrameIn:
    cmd = batch.commands[0]
    # Built without validation: pydantic itself refuses a lone surrogate in a `str` field.
    message = ApprovalRequest.model_construct(
        approval_id=approval_id, batch_id=batch.batch_id, call_id=cmd.call_id, tool=cmd.tool, reason=reason
    )
    return FrameIn(dev, message)


async def memory_and_store(h: Harness) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the engine's memory holds, and what the store holds, of unfinished tasks' nodes, open
    attempts, approvals waiting and devices' fences and current batches (what a restart rebuilds)."""
    e = h.engine
    memory = {
        "tasks": {t: {u: r.state.value for u, r in run.units()} for t, run in e.tasks.items() if not run.terminal},
        "attempts": sorted(e.attempts.open),
        "approvals": sorted(e.approvals.waiting),
        "devices": {d: (dev.fence, dev.current_batch) for d, dev in e.devices.items()},
    }
    snap = await h.store.load_runtime()
    stored = {
        "tasks": {b.task.id: {n.id: n.state for n in b.nodes} for b in snap.tasks},
        "attempts": sorted(a.batch_id for b in snap.tasks for a in b.attempts if a.ended_at is None),
        "approvals": sorted(a.id for a in await h.store.approvals_to_restore() if a.state == "pending"),
        "devices": {d.id: (d.fence, d.current_batch_id) for d in snap.devices},
    }
    return memory, stored


async def step(h: Harness, *items: Input) -> list[asyncio.Future[Any]]:
    """One step; the futures of its inputs (settled, with a result or an exception)."""
    loop = asyncio.get_running_loop()
    for item in items:
        item.done = loop.create_future()
    await h.engine.step(list(items))
    return [item.done for item in items if item.done is not None]


async def two_busy_devices(h: Harness) -> tuple[tuple[str, str, CommandBatch], tuple[str, str, CommandBatch]]:
    out = []
    for name in ("bad", "good"):
        dev = await h.enroll(name, {"who": name})
        await h.connect(dev)
        task = await h.submit(one_node(placement={"labels": {"who": name}}))
        (batch,) = h.batches(dev)
        await h.step(accepted(dev, batch))
        out.append((dev, task, batch))
    return out[0], out[1]


async def test_an_input_the_store_refuses_is_left_out_and_the_rest_of_its_step_commits(h: Harness) -> None:
    (bad, bad_task, bad_batch), (good, good_task, good_batch) = await two_busy_devices(h)
    published: list[dict[str, Any]] = []
    publish = h.engine.writer.bus.publish
    h.engine.writer.bus.publish = lambda events: (published.extend(events), publish(events))[-1]  # type: ignore[method-assign]

    poisoned, honest = await step(h, ask(bad, bad_batch, "apr_bad", POISON), results(good, good_batch))

    assert isinstance(poisoned.exception(), UnicodeError) and refused_data(poisoned.exception())
    assert honest.exception() is None
    assert h.fatal == []
    assert (await h.task(good_task))["state"] == "succeeded"  # committed in the same step
    assert await stored.get(h.store, "apr_bad") is None  # the refused part left no row
    assert not [e for e in published if e["type"] == "approval.requested"]  # nor an event said of it
    assert any(e["task_id"] == good_task for e in published)
    memory, truth = await memory_and_store(h)
    assert memory == truth  # memory keeps nothing of the refused input
    assert "apr_bad" not in h.engine.approvals.waiting

    # The engine goes on: new work for the honest device is placed, run and recorded.
    task = await h.submit(one_node(placement={"labels": {"who": "good"}}))
    batch = h.batches(good)[-1]
    assert batch.task_id == task
    await h.step(accepted(good, batch))
    await h.step(results(good, batch))
    assert (await h.task(task))["state"] == "succeeded"
    assert h.fatal == []
    # The refused device's work on its task ended with a clear code, in a following commit, and
    # memory agrees with the store (no node waiting for an approval nobody stored).
    row = await h.task(bad_task)
    assert (row["state"], row["nodes"], row["errors"]) == ("failed", {"n": "failed"}, {"n": "input_refused"})
    assert row["attempts"] == [("n", bad, "failed", "input_refused")]
    memory, truth = await memory_and_store(h)
    assert memory == truth
    await h.restart()
    assert await memory_and_store(h) == (truth, truth)


async def test_the_steps_own_work_decided_on_a_refused_input_is_left_out_and_redone_from_the_store(h: Harness) -> None:
    """Results the store refuses made the next node ready in memory; the step's own scheduling
    would place it. That placement is left out with them (never stored, never sent): the first
    node ends input_refused, the second is skipped as its edge says, and memory agrees.

    SQLite stores JSON escaped, so here the store refuses results carrying a NUL as Postgres does
    (jsonb holds no \\u0000): a thin wrapper raising the driver's own data error."""
    dev = await h.enroll("solo")
    await h.connect(dev)
    dag = {
        "nodes": [{"id": "a", "commands": [{"tool": "sim.act"}]}, {"id": "b", "commands": [{"tool": "sim.act"}]}],
        "edges": [{"from": "a", "to": "b"}],
    }
    task = await h.submit(dag)
    (batch,) = h.batches(dev)
    await h.step(accepted(dev, batch))
    real = h.engine.writer.store

    async def like_postgres(changes: ChangeSet) -> list[int]:
        if "\\u0000" in json.dumps([list(u.values()) for u in changes.updates.values()], default=str):
            raise sqlite3.DataError("unsupported Unicode escape sequence: \\u0000 cannot be converted to text")
        return await real.write(changes)

    h.engine.writer.store = type("Jsonb", (), {"write": staticmethod(like_postgres)})()
    poisoned = Result.model_construct(call_id=batch.commands[0].call_id, status="success", result={"note": "\x00"})
    frame = FrameIn(dev, ResultBatch.model_construct(batch_id=batch.batch_id, fence=batch.fence, results=[poisoned]))

    (refused_results,) = await step(h, frame)

    assert refused_data(refused_results.exception())
    assert h.fatal == []
    row = await h.task(task)
    assert (row["state"], row["nodes"], row["errors"]["a"]) == (
        "failed",
        {"a": "failed", "b": "skipped"},
        "input_refused",
    )
    assert [a[0] for a in row["attempts"]] == ["a"]  # b was never placed
    assert [b.node_id for b in h.batches(dev)] == ["a"]  # nor sent
    memory, truth = await memory_and_store(h)
    assert memory == truth


async def test_a_store_out_of_reach_still_fails_the_step_after_its_retries(h: Harness) -> None:
    (_, _, batch), _ = await two_busy_devices(h)
    calls = 0

    async def unreachable(changes: ChangeSet) -> list[int]:
        nonlocal calls
        calls += 1
        raise OperationalError("INSERT", {}, ConnectionRefusedError("connection refused"), connection_invalidated=True)

    async def no_wait(_: float) -> None:
        return None

    h.engine.writer.store = type("Down", (), {"write": staticmethod(unreachable)})()
    h.engine.writer.sleep = no_wait
    with pytest.raises(OperationalError):
        await step(h, results("dev_bad", batch))
    assert calls == COMMIT_ATTEMPTS  # retried as before, never split into parts


@pytest.mark.parametrize(
    "exc",
    [
        LeaseLost("the lease moved on"),
        OperationalError("INSERT", {}, ConnectionRefusedError("refused"), connection_invalidated=True),
        RuntimeError("anything else"),
    ],
)
def test_only_the_stores_refusal_of_the_data_counts_as_an_inputs_fault(exc: Exception) -> None:
    assert not refused_data(exc)
