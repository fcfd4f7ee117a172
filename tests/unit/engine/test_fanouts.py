"""Fan-out nodes in the engine (issue 20), step by step on a virtual clock (harness.py): one child
per matching device, canaries first, at most max_parallel at once, the failure budget, cancel,
a lost device and a restart in the middle. What the store holds is checked after each step, as
that is what a restarted orchestrator would see."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from orchestrator.domain.model import Liveness
from orchestrator.engine.records import (
    AgentDone,
    AgentStep,
    CancelTask,
    FrameIn,
    LivenessChanged,
    ToolCall,
)
from orchestrator.store import approvals as stored
from protocol.messages import ApprovalRequest, Cancel, CommandBatch, ErrorInfo
from tests.unit.engine.harness import Harness, accepted, results

WEB = {"role": "web"}


def fan(node_id: str = "x", tool_name: str = "sim.act", **for_each: Any) -> dict[str, Any]:
    return {"id": node_id, "for_each": {"labels": WEB, **for_each}, "commands": [{"tool": tool_name}]}


def sent(h: Harness, node_id: str = "x") -> list[tuple[str, CommandBatch]]:
    """(device, batch) of every command batch of node `node_id`, in the order sent (re-sends too)."""
    return [
        (s.device_id, s.message)
        for s in h.links.sent
        if isinstance(s.message, CommandBatch) and s.message.node_id == node_id
    ]


def open_batches(h: Harness, node_id: str = "x") -> list[tuple[str, CommandBatch]]:
    """The batches of the node whose attempts are open now, one per device."""
    live = {a.batch_id for a in h.engine.attempts.open.values()}
    seen: dict[str, tuple[str, CommandBatch]] = {}
    for dev, batch in sent(h, node_id):
        if batch.batch_id in live:
            seen[batch.batch_id] = (dev, batch)
    return list(seen.values())


async def children(h: Harness, task: str, node_id: str = "x") -> dict[str, tuple[str, str | None]]:
    bundle = await h.store.get_task(task)
    assert bundle is not None
    return {c.device_name: (c.state, (c.error or {}).get("code")) for c in bundle.children if c.node_id == node_id}


async def node_row(h: Harness, task: str, node_id: str = "x") -> Any:
    bundle = await h.store.get_task(task)
    assert bundle is not None
    return next(n for n in bundle.nodes if n.id == node_id)


async def fleet(h: Harness, *names: str, labels: dict[str, str] = WEB) -> dict[str, int]:
    """Enroll and connect devices; their connection epochs by device id."""
    epochs = {}
    for name in names:
        dev = await h.enroll(name, labels)
        _, epochs[dev] = await h.connect(dev)
    return epochs


async def finish(h: Harness, *pairs: tuple[str, CommandBatch], status: str = "success") -> None:
    for dev, batch in pairs:
        await h.step(results(dev, batch, status))


# ---------------------------------------------------------------- one child per device


async def test_a_fan_out_node_runs_once_on_every_matching_device_and_its_output_maps_names(h: Harness) -> None:
    await fleet(h, "web-1", "web-2.example.com", "web-3")
    await fleet(h, "db", labels={"role": "db"})
    task = await h.submit(
        {
            "nodes": [
                fan(),
                {
                    "id": "y",
                    "placement": {"device": "db"},
                    "commands": [{"tool": "sim.look", "arguments": {"v": "${nodes.x.output.web-2.example.com.ok}"}}],
                },
            ],
            "edges": [{"from": "x", "to": "y"}],
        }
    )
    batches = sent(h)
    assert sorted(dev for dev, _ in batches) == ["dev_web-1", "dev_web-2.example.com", "dev_web-3"]
    assert (await h.task(task))["nodes"] == {"x": "running", "y": "pending"}
    await finish(h, *batches)
    row = await node_row(h, task)
    assert row.state == "succeeded"
    assert row.output == {"web-1": {"ok": True}, "web-2.example.com": {"ok": True}, "web-3": {"ok": True}}
    (follow,) = sent(h, "y")
    assert follow[1].commands[0].arguments == {"v": True}
    await finish(h, follow)
    assert (await h.task(task))["state"] == "succeeded"
    assert len(sent(h)) == 3  # nothing ran twice


async def test_canary_devices_run_first_and_the_rest_only_after_all_of_them_succeeded(h: Harness) -> None:
    await fleet(h, "w1", "w2", "w3", "w4")
    task = await h.submit({"nodes": [fan(canary=2)]})
    first = sent(h)
    assert [dev for dev, _ in first] == ["dev_w1", "dev_w2"]  # canaries: the first by name
    await finish(h, first[0])
    assert len(sent(h)) == 2  # one canary still runs: the rest wait
    await finish(h, first[1])
    rest = sent(h)[2:]
    assert [dev for dev, _ in rest] == ["dev_w3", "dev_w4"]
    await finish(h, *rest)
    assert (await h.task(task))["state"] == "succeeded"


async def test_a_failed_canary_skips_the_rest_and_fails_the_node_canary_failed(h: Harness) -> None:
    await fleet(h, "w1", "w2", "w3")
    task = await h.submit(
        {
            "nodes": [fan(canary=1), {"id": "after", "commands": [{"tool": "sim.look"}]}],
            "edges": [{"from": "x", "to": "after"}],
        }
    )
    (canary,) = sent(h)
    await finish(h, canary, status="failure")
    assert await children(h, task) == {
        "w1": ("failed", "tool_error"),
        "w2": ("skipped", "fan_out_halted"),
        "w3": ("skipped", "fan_out_halted"),
    }
    row = await node_row(h, task)
    assert (row.state, row.error["code"]) == ("failed", "canary_failed")
    assert "w1 (tool_error)" in row.error["message"]
    assert (await h.task(task))["nodes"]["after"] == "skipped"
    assert (await h.task(task))["state"] == "failed"
    assert len(sent(h)) == 1


async def test_the_failure_budget_stops_the_rollout_at_its_kth_failed_child(h: Harness) -> None:
    await fleet(h, "w1", "w2", "w3", "w4", "w5")
    task = await h.submit({"nodes": [fan(max_parallel=1, failure_budget=2)]})
    for status in ("failure", "success", "failure"):
        (pair,) = open_batches(h)
        await finish(h, pair, status=status)
    assert await children(h, task) == {
        "w1": ("failed", "tool_error"),
        "w2": ("succeeded", None),
        "w3": ("failed", "tool_error"),
        "w4": ("skipped", "fan_out_halted"),
        "w5": ("skipped", "fan_out_halted"),
    }
    row = await node_row(h, task)
    assert (row.state, row.error["code"]) == ("failed", "failure_budget_exhausted")
    assert row.output == {"w2": {"ok": True}}  # what did succeed stays visible
    assert len(sent(h)) == 3


async def test_a_child_running_when_its_rollout_halts_is_not_placed_again_after_it_fails(h: Harness) -> None:
    """Budget 1, two children at once: one fails and halts the rollout while the other runs; when
    that one fails too, retry-safe (read-only), it does not go back to wait for a device (a
    restart from the store would skip it): it fails, and the node ends."""
    await fleet(h, "w1", "w2")
    node = {**fan(tool_name="sim.look", max_parallel=2, failure_budget=1), "retry": {"max_attempts": 3}}
    task = await h.submit({"nodes": [node]})
    (dev1, first), second = open_batches(h)
    refused = ErrorInfo(code="invalid_arguments", message="never retried")
    await h.step(results(dev1, first, "failure", error=refused))  # failed for good: the rollout halts
    await finish(h, second, status="failure")  # read-only, tries left: it would have run again
    kids = await children(h, task)
    assert sorted(state for state, _ in kids.values()) == ["failed", "failed"], kids
    row = await node_row(h, task)
    assert (row.state, row.error["code"]) == ("failed", "failure_budget_exhausted")
    assert len(sent(h)) == 2


async def test_fewer_failed_children_than_the_budget_are_tolerated(h: Harness) -> None:
    await fleet(h, "w1", "w2", "w3")
    task = await h.submit({"nodes": [fan(failure_budget=2)]})
    batches = sent(h)
    await finish(h, batches[0], status="failure")
    await finish(h, *batches[1:])
    row = await node_row(h, task)
    assert (row.state, row.error) == ("succeeded", None)
    assert sorted(row.output) == ["w2", "w3"]
    assert (await h.task(task))["state"] == "succeeded"


async def test_without_a_budget_every_child_runs_and_one_failure_fails_the_node(h: Harness) -> None:
    await fleet(h, "w1", "w2", "w3")
    task = await h.submit({"nodes": [fan(max_parallel=1)]})
    for status in ("success", "failure", "success"):
        (pair,) = open_batches(h)
        await finish(h, pair, status=status)
    row = await node_row(h, task)
    assert (row.state, row.error["code"]) == ("failed", "fan_out_failed")
    assert (await children(h, task))["w3"] == ("succeeded", None)


async def test_max_parallel_bounds_the_children_running_at_once(h: Harness) -> None:
    await fleet(h, "w1", "w2", "w3", "w4", "w5")
    task = await h.submit({"nodes": [fan(max_parallel=2)]})
    most = 0
    while running := open_batches(h):
        most = max(most, len(running))
        await finish(h, running[0])
    assert most == 2
    assert len(sent(h)) == 5
    assert (await h.task(task))["state"] == "succeeded"


# ---------------------------------------------------------------- which devices


async def test_devices_named_run_in_their_order_and_those_out_of_service_are_left_out(h: Harness) -> None:
    await fleet(h, "a", "b", "c")
    await h.control("dev_b", "cordon")
    task = await h.submit(
        {
            "nodes": [
                {"id": "x", "for_each": {"devices": ["c", "b", "a"], "canary": 1}, "commands": [{"tool": "sim.act"}]}
            ]
        }
    )
    assert [dev for dev, _ in sent(h)] == ["dev_c"]
    row = await node_row(h, task)
    assert row.fan_out["devices"] == 2
    assert row.fan_out["left_out"] == [{"device": "b", "reason": "it was cordoned when the node became ready"}]
    await finish(h, *sent(h))
    await finish(h, *sent(h)[1:])
    assert sorted(await children(h, task)) == ["a", "c"]
    assert (await h.task(task))["state"] == "succeeded"


async def test_a_fan_out_no_device_matches_when_it_becomes_ready_fails_no_matching_device(h: Harness) -> None:
    await fleet(h, "w1")
    await h.control("dev_w1", "drain")
    task = await h.submit({"nodes": [fan()]})
    row = await node_row(h, task)
    assert (row.state, row.error["code"]) == ("failed", "no_matching_device")
    assert "w1: it was draining" in row.error["message"]
    assert sent(h) == []


# ---------------------------------------------------------------- children follow the node rules


async def test_a_child_whose_device_is_lost_runs_again_there_only_when_retry_safe(h: Harness) -> None:
    epochs = await fleet(h, "w1", "w2", "spare")
    retry = {"max_attempts": 2, "backoff_s": 0}
    task = await h.submit(
        {
            "nodes": [
                {"id": "safe", "for_each": {"devices": ["w1"]}, "commands": [{"tool": "sim.look"}], "retry": retry},
                {"id": "unsafe", "for_each": {"devices": ["w2"]}, "commands": [{"tool": "sim.act"}], "retry": retry},
            ]
        }
    )
    for dev, batch in sent(h, "safe") + sent(h, "unsafe"):
        await h.step(accepted(dev, batch))
    for dev in ("dev_w1", "dev_w2"):
        await h.step(LivenessChanged(dev, Liveness.OFFLINE, epochs[dev], "A"))
    assert (await children(h, task, "safe"))["w1"] == ("ready", None)  # pinned: it waits for w1
    assert (await children(h, task, "unsafe"))["w2"] == ("failed", "device_lost")  # may have run: not again
    assert [dev for dev, _ in sent(h, "safe")] == ["dev_w1"]  # the spare device got nothing
    await h.connect("dev_w1")
    again = [pair for pair in sent(h, "safe") if pair[1].attempt == 2]
    assert [dev for dev, _ in again] == ["dev_w1"]
    await finish(h, again[0])
    assert (await node_row(h, task, "safe")).state == "succeeded"
    assert (await node_row(h, task, "unsafe")).error["code"] == "fan_out_failed"


async def test_a_child_waits_for_its_drained_device_until_its_queue_timeout(h: Harness) -> None:
    await fleet(h, "w1", "w2")
    busy = await h.submit(
        {"nodes": [{"id": "first", "placement": {"device": "w1"}, "commands": [{"tool": "sim.act"}]}]}
    )
    task = await h.submit({"nodes": [{**fan(), "queue_timeout_s": 30}]})
    assert await children(h, task) == {"w1": ("queued", None), "w2": ("running", None)}
    await h.control("dev_w1", "drain")
    (first,) = sent(h, "first")
    await finish(h, first, *sent(h))
    assert (await children(h, task))["w1"] == ("ready", None)  # drained: it takes nothing new
    await h.advance(31)
    assert (await children(h, task))["w1"] == ("failed", "queue_timeout")
    assert (await node_row(h, task)).error["code"] == "fan_out_failed"
    assert (await h.task(busy))["state"] == "succeeded"


async def test_cancel_mid_fan_out_cancels_waiting_children_and_stops_running_ones(h: Harness) -> None:
    await fleet(h, "w1", "w2", "w3")
    task = await h.submit({"nodes": [fan(max_parallel=1)]})
    ((dev, batch),) = sent(h)
    await h.step(accepted(dev, batch))
    await h.step(CancelTask(task))
    assert [s.message.batch_id for s in h.links.sent if isinstance(s.message, Cancel)] == [batch.batch_id]
    assert await children(h, task) == {
        "w1": ("running", None),
        "w2": ("cancelled", None),
        "w3": ("cancelled", None),
    }
    await h.step(results(dev, batch, "skipped"))
    assert (await children(h, task))["w1"][0] == "cancelled"
    assert (await node_row(h, task)).state == "cancelled"
    assert (await h.task(task))["state"] == "cancelled"
    assert len(sent(h)) == 1


async def test_a_restart_mid_fan_out_rebuilds_the_rollout_and_runs_no_child_twice(h: Harness) -> None:
    epochs = await fleet(h, "w1", "w2", "w3", "w4")
    task = await h.submit({"nodes": [fan(canary=1, max_parallel=2)]})
    (canary,) = sent(h)
    await finish(h, canary)
    running = open_batches(h)
    assert sorted(dev for dev, _ in running) == ["dev_w2", "dev_w3"]
    for dev, batch in running:
        await h.step(accepted(dev, batch))
    await h.restart()  # kill -9 and a restart: the engine rebuilds from the store
    h.links.sent.clear()
    for dev in epochs:
        await h.connect(dev, resumed=True)
    resent = sent(h)
    assert sorted((dev, b.batch_id) for dev, b in resent) == sorted((dev, b.batch_id) for dev, b in running)
    await finish(h, *resent)
    (last,) = open_batches(h)
    assert last[0] == "dev_w4"
    await finish(h, last)
    assert (await h.task(task))["state"] == "succeeded"
    attempts = (await h.task(task))["attempts"]
    assert sorted(dev for _, dev, _, _ in attempts) == ["dev_w1", "dev_w2", "dev_w3", "dev_w4"]  # one each


# ---------------------------------------------------------------- approvals and agent nodes


async def test_a_child_waiting_for_approval_shows_it_and_its_node_stays_running(h: Harness) -> None:
    await fleet(h, "w1", "w2")
    task = await h.submit({"nodes": [fan()]})
    dev, batch = sent(h)[0]
    await h.step(accepted(dev, batch))
    cmd = batch.commands[0]
    request = ApprovalRequest(approval_id="apr_1", batch_id=batch.batch_id, call_id=cmd.call_id, tool=cmd.tool)
    await h.step(FrameIn(dev, request))
    name = dev.removeprefix("dev_")
    assert (await children(h, task))[name] == ("waiting_approval", None)
    assert (await node_row(h, task)).state == "running"
    approval = await stored.get(h.store, "apr_1")
    assert approval is not None and (approval.node_id, approval.device_id) == ("x", dev)


async def test_an_agent_node_fans_out_one_step_loop_per_device(tmp_path: Path) -> None:
    h = await (await asyncio.to_thread(Harness, tmp_path)).open(planner=True)
    try:
        await fleet(h, "w1", "w2")
        task = await h.submit(
            {"nodes": [{"id": "x", "kind": "agent", "instruction": "tidy up", "for_each": {"labels": WEB}}]}
        )
        assert h.planner is not None and len(h.planner.agents) == 2
        outputs = {}
        for i, attempt in enumerate(h.planner.agents):
            await h.step(AgentStep(attempt, [ToolCall("sim.look", {})]))
            dev, step = next(
                (s.device_id, s.message) for s in reversed(h.links.sent) if isinstance(s.message, CommandBatch)
            )
            await h.step(results(dev, step))
            await h.step(AgentDone(attempt, True, output=f"done {i}"))
            outputs[dev.removeprefix("dev_")] = f"done {i}"
        row = await node_row(h, task)
        assert (row.state, row.output) == ("succeeded", outputs)
    finally:
        await h.close()
