"""Round trip of one no-op command through the whole system, against a raw WebSocket echo and Ray.

Orrery's figure is orchestrator -> agent -> result through the full engine: the engine assigns
the node (attempt row, fence), commits, sends the `command_batch`; the agent records the batch
in its ledger, calls `system.echo` (in process, through the built-in toolset's own validated entry
point), records the result in its outbox and sends `result_batch` (which accepts a quick batch: no
`batch_accepted` of its own); the engine applies it. Each sample is one attempt's
`ended_at - started_at` from the store, over a chain of sequential nodes on one device.

The raw echo sends a frame of the same size to a `websockets` echo server in another process and
waits for it to come back. Ray is `ray.get(f.remote())` of a no-op task (`num_cpus=2`). The
durable floor (`bench/rtt_floor.py`) is the same round trip with only its hops and its commits
(the same statements on a real store and a real ledger, no engine, no validation, no checks): the
least a round trip that keeps Orrery's durability can cost with these libraries on this machine.

With `--store postgres` the orchestrator and the floor's server both run on a throwaway durable
Postgres (bench/stores.py); with `--replicas N` the agent connects to a follower, so each frame
also takes the relay hop to the leader, and the floor's commits check the engine lease as the
leader's do.

    python bench/rtt.py [--nodes 300] [--echo 2000] [--ray 2000] [--floor 1000]
                        [--store sqlite|postgres] [--replicas N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from bench.echo import echo_rtt, frame_size, percentile
from bench.rtt_floor import floor_rtt
from bench.stores import add_store_options, check_store_options, describe, from_args, labels, one_postgres


def orrery_rtt(nodes: int, args: argparse.Namespace) -> tuple[list[float], dict[str, list[float]]]:
    with from_args(args) as fleet:
        fleet.agent_at(fleet.follower().url, "bench")
        ids = [f"n{i}" for i in range(nodes)]
        dag = {
            "nodes": [{"id": n, "commands": [{"tool": "system.echo", "arguments": {"text": "x"}}]} for n in ids],
            "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
        }
        task = fleet.wait_task(fleet.submit(dag)["id"], timeout=600)
        assert task["state"] == "succeeded", task["state"]
    samples, accept, tool, by_results = [], [], [], 0
    for node in task["nodes"][10:]:  # the first few warm caches and connections
        a = node["attempts"][0]
        start, end = _ts(a["started_at"]), _ts(a["ended_at"])
        samples.append((end - start) * 1000)
        if a["accepted_at"] == a["ended_at"]:
            by_results += 1  # accepted by its results (a quick batch sends no batch_accepted of its own)
        else:
            accept.append((_ts(a["accepted_at"]) - start) * 1000)
        tool.append(a["results"][0]["duration_ms"])
    parts = {"MCP call on device": tool}
    if accept:
        parts["to batch_accepted (where one was sent)"] = accept
    print(f"{by_results} of {len(samples)} batches were accepted by their results")
    return samples, parts


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def ray_rtt(n: int) -> list[float] | None:
    if n <= 0:
        return None
    try:
        import ray
    except ImportError:
        return None
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")

    @ray.remote
    def noop() -> None:
        return None

    try:
        for _ in range(100):
            ray.get(noop.remote())
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            ray.get(noop.remote())
            samples.append((time.perf_counter() - t0) * 1000)
        return samples
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--echo", type=int, default=2000)
    parser.add_argument("--ray", type=int, default=2000)
    parser.add_argument("--floor", type=int, default=1000, help="rounds of the durable floor (0: skip it)")
    add_store_options(parser)
    args = parser.parse_args()
    check_store_options(parser, args)
    if args.floor < 0 or args.floor == 1:
        parser.error("--floor is 0 (leave the floor out) or at least 2 rounds")
    if args.echo < 1:
        parser.error("--echo: at least 1 round")
    size = frame_size()
    with one_postgres(args.store):
        orrery, parts = orrery_rtt(args.nodes, args)
        echo = echo_rtt(size, args.echo)
        clustered = args.replicas > 1 or args.redis
        floor = floor_rtt(args.floor, args.store, guard=clustered) if args.floor else None
    ray_samples = ray_rtt(args.ray)
    base = statistics.median(echo)
    rows: list[tuple[str, list[float]]] = [("raw websockets echo", echo)]
    if floor:
        rows.append(("durable floor (hops and commits only)", floor))
    if ray_samples:
        rows.append(("Ray no-op ray.get(f.remote())", ray_samples))
    rows.append(("Orrery no-op command (full engine)", orrery))
    print(f"\nround trip, {size}-byte frame; p50/p99 in ms; ratio = p50 / raw echo p50")
    print(f"Orrery and the floor on {describe(args.store, args.replicas, args.redis)}\n")
    print(f"{'system':40} {'n':>6} {'p50':>8} {'p99':>8} {'ratio':>7}")
    for name, samples in rows:
        p50, p99 = statistics.median(samples), percentile(samples, 0.99)
        print(f"{name:40} {len(samples):>6} {p50:>8.3f} {p99:>8.3f} {p50 / base:>7.1f}")
    if floor:
        print(f"\nOrrery / durable floor: {statistics.median(orrery) / statistics.median(floor):.2f}x")
    print("\nwhere Orrery's time goes (p50, ms):")
    for name, samples in parts.items():
        print(f"  {name:38} {statistics.median(samples):8.3f}")
    print(
        json.dumps(
            {
                "orrery_p50": statistics.median(orrery),
                "echo_p50": base,
                "ray_p50": statistics.median(ray_samples) if ray_samples else None,
                "floor_p50": statistics.median(floor) if floor else None,
                **labels(args),
            }
        )
    )


if __name__ == "__main__":
    main()
