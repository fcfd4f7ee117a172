"""A fan-out at scale (issue 20): 80 simulated devices (real protocol clients over WebSockets,
tests/simdevice.py) against a real server. Canaries first, at most max_parallel children at once
(from the devices' own execution times), two devices failing within the failure budget, each
device running the command once and its verify command once. `bench/fanout.py` runs 500."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.simdevice import SimFleet, ToolFailure
from tests.support import Fleet

DEVICES = 80
CANARY = 4
MOST = 16
FAILING = {"web-050", "web-070"}


def refuse(_arguments: dict[str, Any], _attempt: int) -> Any:
    raise ToolFailure("tool_error", "this device's disk is full")


async def work(_arguments: dict[str, Any], _attempt: int) -> Any:
    await asyncio.sleep(0.1)  # long enough for children to overlap
    return {"ok": True}


def test_an_80_device_rollout_keeps_its_canaries_parallelism_and_budget(tmp_path: Path) -> None:
    with Fleet(tmp_path) as fleet:
        sims = SimFleet()
        try:
            by_name = {}
            for i in range(DEVICES):
                name = f"web-{i:03d}"
                handlers = {"sim.act": refuse if name in FAILING else work}
                enrolled = fleet.enroll(name, {"role": "web"})
                by_name[name] = sims.add(fleet.server.url, enrolled, labels={"role": "web"}, handlers=handlers)
            node = {
                "id": "rollout",
                "for_each": {"labels": {"role": "web"}, "canary": CANARY, "max_parallel": MOST, "failure_budget": 3},
                "commands": [{"tool": "sim.act", "arguments": {}}],
                "verify": [{"tool": "sim.noop", "arguments": {}}],
            }
            done = fleet.wait_task(fleet.submit({"nodes": [node]})["id"], timeout=120)
            rollout = fleet.node(done, "rollout")
            assert (done["state"], rollout["state"]) == ("succeeded", "succeeded"), rollout.get("error")
            states = {c["device"]: c["state"] for c in rollout["children"]}
            assert {n for n, st in states.items() if st == "failed"} == FAILING
            assert len(rollout["output"]) == DEVICES - len(FAILING)
            runs = {name: [e for e in d.executions if e.node_id == "rollout"] for name, d in by_name.items()}
            for name, executions in runs.items():
                assert len(executions) == (1 if name in FAILING else 2), name  # once, then verified once
            canaries = [f"web-{i:03d}" for i in range(CANARY)]
            canary_done = max(e.ended for n in canaries for e in runs[n])
            assert all(e.started >= canary_done for n in runs if n not in canaries for e in runs[n])
            spans = [(min(e.started for e in ex), max(e.ended for e in ex)) for ex in runs.values()]
            busiest = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
            assert MOST // 2 <= busiest <= MOST  # they did run side by side, never more than the cap
        finally:
            sims.close()
