"""The agent's own cost per batch: a real agent in this process, its ledger, router and built-in
toolsets, over a real WebSocket, against a scripted orchestrator (tests/unit/device_agent/scripted.py)
that sends the next one-command `command_batch` (`system.echo`) as soon as the last `result_batch`
is in.

Two figures:
- wall time per batch (p50), with the partner's turn, which moves with the machine's load;
- with `--instructions`, instructions per batch (agent and partner in one process), counted by
  valgrind (`--tool=callgrind`) over two runs of different lengths and differenced, so start-up
  cancels out. The count is the same on a busy machine as on an idle one: use it to compare two
  versions of the code.

    python bench/agent_batch.py [--batches 500] [--instructions]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stores import check_refused, refuse_store
from device_agent.config import AgentConfig
from device_agent.runner import build
from tests.unit.device_agent.scripted import TOKEN, ScriptedOrchestrator

WARMUP = 20


async def run(batches: int) -> list[float]:
    """Per-batch wall times (µs), from sending a `command_batch` to its `result_batch` arriving."""
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        async with ScriptedOrchestrator().running() as server:
            config = AgentConfig(server=server.url, token=TOKEN, data_dir=Path(tmp) / "agent")
            agent = build(config)
            task = asyncio.create_task(agent.run())
            try:
                conn = await server.next_connection()
                await conn.welcome()
                times = []
                for i in range(batches):
                    t0 = time.perf_counter_ns()
                    batch_id = await conn.batch({"tool": "system.echo", "arguments": {"text": "x"}}, fence=i + 1)
                    frame = await conn.recv("result_batch")
                    times.append((time.perf_counter_ns() - t0) / 1000)
                    assert frame["batch_id"] == batch_id and frame["results"][0]["status"] == "success", frame
                return times
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                agent.ledger.close()
                agent.router.audit.close()


def instructions(batches: int) -> float:
    """Instructions per batch: callgrind totals of a short and a long run, differenced."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    totals = []
    for n in (batches // 5, batches):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={tmp}/cg.out",
                    sys.executable,
                    __file__,
                    "--batches",
                    str(n),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        match = re.search(r"Collected : (\d+)", out.stderr)
        assert match, out.stderr[-2000:]
        totals.append(int(match.group(1)))
    return (totals[1] - totals[0]) / (batches - batches // 5)


WHY_NO_STORE = "it times the agent alone against a scripted partner; there is no orchestrator store in it"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--instructions", action="store_true", help="count instructions per batch with valgrind")
    refuse_store(parser, WHY_NO_STORE)
    args = parser.parse_args()
    check_refused(parser, args, WHY_NO_STORE)
    if args.instructions:
        per_batch = instructions(args.batches)
        print(f"agent, one-command no-op batch: {per_batch / 1e6:.3f}M instructions per batch (with its partner)")
        print(json.dumps({"instructions_per_batch": per_batch}))
        return
    times = asyncio.run(run(args.batches))[WARMUP:]
    p50 = statistics.median(times)
    print(f"agent, one-command no-op batch: p50 {p50:.1f} µs over {len(times)} batches (with its partner)")
    print(json.dumps({"batch_p50_us": p50}))


if __name__ == "__main__":
    main()
