"""The engine's own cost per chained node: no sockets, no agent, the real engine and SQLite store.

A chain of no-op nodes on one device, driven step by step through the in-process engine harness
(tests/unit/engine/harness.py): each step takes the device's `result_batch` for the running node,
ends its attempt, assigns the next node, commits, and hands the next `command_batch` to the
stand-in gateway. What the server does between a result frame decoded and the next frame encoded,
without the gateway and the WebSocket around it.

Two figures:
- wall time per step (p50), which moves with the machine's load;
- with `--instructions`, instructions per node, counted by valgrind (`--tool=callgrind`) over two
  chains of different lengths and differenced, so start-up and the warm-up cancel out. The count
  is the same on a busy machine as on an idle one: use it to compare two versions of the code.

    python bench/engine_step.py [--nodes 500] [--instructions]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.messages import CommandBatch
from tests.unit.engine.harness import Harness, results

WARMUP = 20


async def chain(nodes: int) -> list[float]:
    """Per-step wall times (µs) of a chain of `nodes` no-op nodes."""
    with tempfile.TemporaryDirectory() as tmp:
        h = await (await asyncio.to_thread(Harness, Path(tmp))).open()
        try:
            device = await h.enroll("d1")
            await h.connect(device)
            ids = [f"n{i}" for i in range(nodes)]
            dag = {
                "nodes": [{"id": n, "commands": [{"tool": "sim.act", "arguments": {"text": "x"}}]} for n in ids],
                "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
            }
            await h.submit(dag)
            times = []
            for _ in range(nodes):
                batch = h.links.sent[-1].message
                assert isinstance(batch, CommandBatch)
                frame = results(device, batch)
                t0 = time.perf_counter_ns()
                await h.step(frame)
                times.append((time.perf_counter_ns() - t0) / 1000)
                h.clock.now += 0.001
            state = (await h.task("task_1"))["state"]
            assert state == "succeeded", state
            return times
        finally:
            await h.close()


def instructions(nodes: int) -> float:
    """Instructions per node: callgrind totals of a short and a long chain, differenced."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    totals = []
    for n in (nodes // 5, nodes):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={tmp}/cg.out",
                    sys.executable,
                    __file__,
                    "--nodes",
                    str(n),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        match = re.search(r"Collected : (\d+)", out.stderr)
        assert match, out.stderr[-2000:]
        totals.append(int(match.group(1)))
    return (totals[1] - totals[0]) / (nodes - nodes // 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--instructions", action="store_true", help="count instructions per node with valgrind")
    args = parser.parse_args()
    if args.instructions:
        per_node = instructions(args.nodes)
        print(f"engine step, chained no-op node: {per_node / 1e6:.3f}M instructions per node")
        print(json.dumps({"instructions_per_node": per_node}))
        return
    times = asyncio.run(chain(args.nodes))[WARMUP:]
    p50 = statistics.median(times)
    print(f"engine step, chained no-op node: p50 {p50:.1f} µs over {len(times)} steps")
    print(json.dumps({"step_p50_us": p50}))


if __name__ == "__main__":
    main()
