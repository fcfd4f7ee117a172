"""The engine's own cost per node: no sockets, no agent, the real engine and SQLite store.

Driven step by step through the in-process engine harness (tests/unit/engine/harness.py), with
the server's garbage-collector settings (`orchestrator.app.tune_gc`). Two shapes:
- `chain` (the round trip's): no-op nodes one after another on one device; each step takes the
  device's `result_batch` for the running node, ends its attempt, assigns the next node, commits,
  and hands the next `command_batch` to the stand-in gateway;
- `layered` (`bench/dag_throughput.py`'s): LAYERS x 100 no-op nodes, each after two of the layer
  before, on 50 devices; each step takes the results of every batch the last one sent.
What the server does between result frames decoded and the next frames encoded, without the
gateway and the WebSocket around it.

Two figures:
- wall time per step (p50), which moves with the machine's load;
- with `--instructions`, instructions per node, counted by valgrind (`--tool=callgrind`) over two
  chains of different lengths and differenced, so start-up and the warm-up cancel out. The count
  is the same on a busy machine as on an idle one: use it to compare two versions of the code.

    python bench/engine_step.py [--shape chain|layered] [--nodes 500] [--instructions] [--store sqlite|postgres]

With `--store postgres` the harness's engine writes to a throwaway durable Postgres instead
(bench/stores.py: `synchronous_commit=on`), and the group commit's share is a Postgres
transaction's (wall time only: `--instructions` counts this process, not the database server).

`--nodes` is the chain's length, or for `layered` the number of nodes (a multiple of 100).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dag_throughput import dag as layered_dag
from bench.rtt_floor import harness
from bench.stores import add_store_options, check_refused, check_store_options, labels, postgres_database, refuse_store
from orchestrator.app import tune_gc
from protocol.messages import CommandBatch
from tests.unit.engine.harness import chain_dag, results

WARMUP = 20


async def chain(nodes: int, commits: list[float] | None = None, database_url: str | None = None) -> list[float]:
    """Per-step wall times (µs) of a chain of `nodes` no-op nodes; with `commits`, the group
    commit's share of each step (the store's `write`, its transaction) is appended to it. On the
    SQLite file of the harness, or on the Postgres database at `database_url`."""
    with tempfile.TemporaryDirectory() as tmp:
        h = await harness(Path(tmp), database_url)
        if commits is not None:
            write = h.store.write

            async def timed_write(changes: Any) -> list[int]:
                t0 = time.perf_counter_ns()
                try:
                    return await write(changes)
                finally:
                    commits.append((time.perf_counter_ns() - t0) / 1000)

            h.store.write = timed_write  # type: ignore[method-assign]
        try:
            device = await h.enroll("d1")
            await h.connect(device)
            await h.submit(chain_dag(nodes))
            if commits is not None:
                commits.clear()  # the submission's own
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


async def layered(nodes: int, devices: int = 50, width: int = 100, database_url: str | None = None) -> list[float]:
    """Per-node wall times (µs) of a layered DAG of `nodes` no-op nodes on `devices` devices: each
    step's time shared by the nodes whose results it took."""
    with tempfile.TemporaryDirectory() as tmp:
        h = await harness(Path(tmp), database_url, max_nodes_per_task=nodes)
        try:
            for i in range(devices):
                await h.connect(await h.enroll(f"d{i}"))
            spec = layered_dag(nodes // width, width)
            for node in spec["nodes"]:
                node["commands"][0]["tool"] = "sim.act"
            await h.submit(spec)
            times: list[float] = []
            seen = 0
            while batches := [s for s in h.links.sent[seen:] if isinstance(s.message, CommandBatch)]:
                seen = len(h.links.sent)
                frames = [results(s.device_id, s.message) for s in batches]  # type: ignore[arg-type]
                t0 = time.perf_counter_ns()
                await h.step(*frames)
                times += [(time.perf_counter_ns() - t0) / 1000 / len(frames)] * len(frames)
                h.clock.now += 0.001
            state = (await h.task("task_1"))["state"]
            assert state == "succeeded" and len(times) == nodes, (state, len(times))
            return times
        finally:
            await h.close()


def instructions(shape: str, nodes: int) -> float:
    """Instructions per node: callgrind totals of a short and a long chain, differenced."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    totals = []
    short = nodes // 5 if shape == "chain" else max(100, nodes // 500 * 100)
    for n in (short, nodes):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={tmp}/cg.out",
                    sys.executable,
                    __file__,
                    "--shape",
                    shape,
                    "--nodes",
                    str(n),
                    "--bare",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        match = re.search(r"Collected : (\d+)", out.stderr)
        assert match, out.stderr[-2000:]
        totals.append(int(match.group(1)))
    return (totals[1] - totals[0]) / (nodes - short)


ONE_PROCESS = "the engine runs in this process, without replicas"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("chain", "layered"), default="chain")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--instructions", action="store_true", help="count instructions per node with valgrind")
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)  # no commit timing (--instructions)
    add_store_options(parser, replicas=False)
    refuse_store(parser, ONE_PROCESS, store=False)
    args = parser.parse_args()
    check_refused(parser, args, ONE_PROCESS, store=False)
    check_store_options(parser, args)
    if args.instructions and args.store != "sqlite":
        parser.error("--instructions counts this process's instructions: on SQLite only (the store is in it)")
    what = "chained no-op node" if args.shape == "chain" else "layered DAG, 50 devices"
    what += f", {args.store}"
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(postgres_database()) if args.store == "postgres" else None
        run(args, what, url)


def run(args: argparse.Namespace, what: str, url: str | None) -> None:
    store = labels(args)
    if args.instructions:
        per_node = instructions(args.shape, args.nodes)
        print(f"engine step, {what}: {per_node / 1e6:.3f}M instructions per node")
        print(json.dumps({"instructions_per_node": per_node, **store}))
        return
    tune_gc()
    if args.shape == "layered":
        times = asyncio.run(layered(args.nodes, database_url=url))[WARMUP:]
        p50 = statistics.median(times)
        print(f"engine step, {what}: p50 {p50:.1f} µs per node over {len(times)} nodes")
        print(json.dumps({"step_p50_us": p50, **store}))
        return
    if args.bare:
        asyncio.run(chain(args.nodes, database_url=url))
        return
    commits: list[float] = []
    times = asyncio.run(chain(args.nodes, commits, url))[WARMUP:]
    p50, commit_p50 = statistics.median(times), statistics.median(commits[WARMUP:])
    print(f"engine step, {what}: p50 {p50:.1f} µs per node over {len(times)} nodes")
    print(f"  of which the group commit (the store's write): p50 {commit_p50:.1f} µs")
    print(json.dumps({"step_p50_us": p50, "commit_p50_us": commit_p50, **store}))


if __name__ == "__main__":
    main()
