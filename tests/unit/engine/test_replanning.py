"""Re-planning in the engine: each held failure is asked about once per round, and a task whose
re-plans are spent lets its waiting failures go at once, as a restart from the store would
(both found by the deterministic simulation, tests/sim)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestrator.domain.edits import AddEdge, AddNode, EditList
from orchestrator.domain.model import EdgeSpec, NodeSpec
from orchestrator.engine.records import ReplanDone
from tests.unit.engine.harness import Harness, results


async def test_applying_a_re_plan_does_not_ask_the_planner_about_the_same_failure_again(tmp_path: Path) -> None:
    h = await (await asyncio.to_thread(Harness, tmp_path)).open(planner=True)
    try:
        dev = await h.enroll("solo")
        await h.connect(dev)
        dag = {
            "nodes": [{"id": n, "commands": [{"tool": "sim.act"}]} for n in ("a", "b")],
            "edges": [{"from": "a", "to": "b"}],
        }
        task = await h.submit(dag, replan=True)
        (first,) = h.batches(dev)
        await h.step(results(dev, first, status="failure"))  # held for the re-planner
        assert h.planner is not None and h.planner.replans == [(task, "a")]
        edits = EditList(
            reason="clean up instead",
            edits=[
                AddNode(node=NodeSpec.model_validate({"id": "fix", "commands": [{"tool": "sim.act"}]})),
                AddEdge(edge=EdgeSpec.model_validate({"from": "a", "to": "fix", "on": "failure"})),
            ],
        )
        await h.step(ReplanDone(task, "a", edits))
        assert h.planner.replans == [(task, "a")]  # one round, not a second one for the same failure
        fix = next(b for b in h.batches(dev) if b.node_id == "fix")
        await h.step(results(dev, fix))
        bundle = await h.store.get_task(task)
        assert bundle is not None and bundle.task.replans_used == 1
        assert (await h.task(task))["nodes"] == {"a": "failed", "b": "skipped", "fix": "succeeded"}
    finally:
        await h.close()


async def test_when_the_re_plans_are_spent_failures_still_waiting_take_their_course_at_once(tmp_path: Path) -> None:
    h = await (await asyncio.to_thread(Harness, tmp_path, max_replans=1)).open(planner=True)
    try:
        one, two = await h.enroll("one"), await h.enroll("two")
        await h.connect(one)
        await h.connect(two)
        dag = {
            "nodes": [
                {"id": "a", "commands": [{"tool": "sim.act"}], "placement": {"device": "one"}},
                {"id": "b", "commands": [{"tool": "sim.act"}], "placement": {"device": "two"}},
                {"id": "c", "commands": [{"tool": "sim.act"}]},
            ],
            "edges": [{"from": "a", "to": "c"}, {"from": "b", "to": "c"}],
        }
        task = await h.submit(dag, replan=True)
        (on_one,), (on_two,) = h.batches(one), h.batches(two)
        await h.step(results(one, on_one, status="failure"), results(two, on_two, status="failure"))
        assert h.planner is not None and sorted(h.planner.replans) == [(task, "a"), (task, "b")]
        await h.step(ReplanDone(task, "a", None))  # the one re-plan the task may have
        live = await h.task(task)
        assert live["state"] == "failed"  # b's answer is not waited for: the budget is spent
        await h.step(ReplanDone(task, "b", None))  # a late answer changes nothing
        await h.restart()
        assert await h.task(task) == live
    finally:
        await h.close()
