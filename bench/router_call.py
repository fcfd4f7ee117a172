"""The agent's own cost per tool call: the real router, a no-op built-in tool, no ledger or socket.

The router built the way `device_agent.runner.build` builds it (default toolsets, a temporary data
dir, its audit log, kill switch and budgets), started, then `Router.call` of `system.echo` N times:
the checks around a call (arguments, stop latch, kill switch, policy, budgets), the audit intent
and outcome lines, the in-process call into the toolset's MCP server, and the conversion of its
answer into a `Result`. What a command costs the agent between its batch recorded and its
result recorded, without the ledger and the WebSocket around it.

Two figures:
- wall time per call (p50), which moves with the machine's load;
- with `--instructions`, instructions per call, counted by valgrind (`--tool=callgrind`) over two
  runs of different lengths and differenced, so start-up and the warm-up cancel out. The count is
  the same on a busy machine as on an idle one: use it to compare two versions of the code.

    python bench/router_call.py [--calls 2000] [--instructions]
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
from device_agent.router import CallLimit
from device_agent.runner import build
from protocol.messages import Command
from tests.unit.device_agent.scripted import TOKEN

WARMUP = 20


async def run(calls: int) -> list[float]:
    """Per-call wall times (µs) of `calls` calls of `system.echo`."""
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        config = AgentConfig(server="ws://127.0.0.1:1", token=TOKEN, data_dir=Path(tmp) / "agent")
        agent = build(config)
        router = agent.router
        await router.start()
        try:
            # One command and limit, built once, as the agent hands them over (their validation is
            # the agent's cost, not the router's).
            cmd = Command(call_id="c1", tool="system.echo", arguments={"text": "x"})
            limit = CallLimit(30.0)
            times = []
            for i in range(calls):
                t0 = time.perf_counter_ns()
                result = await router.call(cmd, f"b{i}", limit)
                times.append((time.perf_counter_ns() - t0) / 1000)
                assert result.status == "success", result
            return times
        finally:
            await router.stop()
            agent.ledger.close()
            router.audit.close()


def instructions(calls: int) -> float:
    """Instructions per call: callgrind totals of a short and a long run, differenced."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    totals = []
    for n in (calls // 5, calls):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={tmp}/cg.out",
                    sys.executable,
                    __file__,
                    "--calls",
                    str(n),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        match = re.search(r"Collected : (\d+)", out.stderr)
        assert match, out.stderr[-2000:]
        totals.append(int(match.group(1)))
    return (totals[1] - totals[0]) / (calls - calls // 5)


WHY_NO_STORE = "it times the agent's router in process; there is no orchestrator store in it"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--instructions", action="store_true", help="count instructions per call with valgrind")
    refuse_store(parser, WHY_NO_STORE)
    args = parser.parse_args()
    check_refused(parser, args, WHY_NO_STORE)
    if args.instructions:
        per_call = instructions(args.calls)
        print(f"router call, system.echo in process: {per_call / 1e3:.1f}K instructions per call")
        print(json.dumps({"instructions_per_call": per_call}))
        return
    times = asyncio.run(run(args.calls))[WARMUP:]
    p50 = statistics.median(times)
    print(f"router call, system.echo in process: p50 {p50:.1f} µs over {len(times)} calls")
    print(json.dumps({"call_p50_us": p50}))


if __name__ == "__main__":
    main()
