"""DAG throughput: a layered DAG of no-op nodes on simulated devices, with every state change durable.

Shape: LAYERS layers of WIDTH nodes (default 20 x 100 = 2,000); each node after the first layer
depends on two nodes of the layer before. Orrery runs it on DEVICES simulated devices (real
protocol clients over WebSockets, all in this process) against a real `orrery serve` with its
durable SQLite store. The simulated devices accept a batch that starts at once by its results,
as the real agent does (`device_agent.agent.ACCEPT_AFTER_S`): one frame each way per node.
Dask distributed (LocalCluster, 2 single-threaded worker processes, futures) and Ray
(num_cpus=2) run the same DAG shape of no-op tasks in the same run. Each clock runs from the
first submission until the whole DAG is known done: Ray's until `ray.get` of the last layer,
Orrery's until the task's terminal event on its event stream (published after the commit that
ended the task); the full task view is read and checked after the clock stops.

With `--store postgres` the orchestrator runs on a throwaway durable Postgres, with
`--replicas N` as N replicas (and Redis), the devices spread over them in turn (bench/stores.py).

    python bench/dag_throughput.py [--layers 20] [--width 100] [--devices 50] [--skip-peers]
                                   [--store sqlite|postgres] [--replicas N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench.stores import add_store_options, check_store_options, describe, from_args, labels
from tests.simdevice import SimFleet


def parents(layer: int, i: int, width: int) -> list[tuple[int, int]]:
    return [] if layer == 0 else [(layer - 1, i), (layer - 1, (i + 1) % width)]


def dag(layers: int, width: int) -> dict[str, Any]:
    nodes = [
        {"id": f"l{L}n{i}", "commands": [{"tool": "sim.noop", "arguments": {}}]}
        for L in range(layers)
        for i in range(width)
    ]
    edges = [
        {"from": f"l{pl}n{pi}", "to": f"l{L}n{i}"}
        for L in range(layers)
        for i in range(width)
        for pl, pi in parents(L, i, width)
    ]
    return {"nodes": nodes, "edges": edges}


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_orrery(layers: int, width: int, devices: int, args: argparse.Namespace) -> dict[str, Any]:
    with from_args(args, max_nodes_per_task=str(layers * width)) as fleet:
        sims = SimFleet(uvloop.new_event_loop())  # the devices' side as lean as it can be (like Ray's workers)
        try:
            for i in range(devices):
                sims.add(fleet.device_url(i), fleet.enroll(f"sim-{i:03d}"), accept_by_results=True)
            spec = dag(layers, width)
            started = time.perf_counter()
            task = fleet.submit(spec)
            # The clock stops at the task's terminal event on its event stream, published after the
            # commit that ended the task (as Ray's stops at `ray.get`; counting the GET of the whole
            # task view below too cost ~0.5 s of a 1-2 s run for 2,000 nodes).
            end = fleet.follow_task(task["id"], timeout=3600)
            assert end is not None and end[1] == "succeeded", end
            elapsed = end[0] - started
            done = fleet.task(task["id"])  # checked after the clock stopped, as Ray's results are not read
            assert done["state"] == "succeeded" and all(n["state"] == "succeeded" for n in done["nodes"]), done["state"]
            executions = sum(len(d.executions) for d in sims.devices)
            assert executions == layers * width, f"{executions} executions for {layers * width} nodes"
            rss = [peak_rss_mb(pid) for pid in fleet.pids()]
            return {
                "seconds": elapsed,
                "nodes_per_s": layers * width / elapsed,
                "server_peak_rss_mb": max(rss),  # the largest replica's
                "replica_peak_rss_mb": rss,
            }
        finally:
            sims.close()


def noop(*_deps: Any) -> None:
    return None


def run_dask(layers: int, width: int) -> float | None:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        return None
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        client.submit(noop, pure=False).result()  # warm up
        started = time.perf_counter()
        prev: list[Any] = []
        for layer in range(layers):
            cur = [
                client.submit(noop, *[prev[p] for _, p in parents(layer, i, width)], pure=False) for i in range(width)
            ]
            prev = cur
        client.gather(prev)
        return layers * width / (time.perf_counter() - started)


def run_ray(layers: int, width: int) -> float | None:
    try:
        import ray
    except ImportError:
        return None
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        remote = ray.remote(noop)
        ray.get([remote.remote() for _ in range(100)])  # warm up the workers
        started = time.perf_counter()
        prev: list[Any] = []
        for layer in range(layers):
            prev = [remote.remote(*[prev[p] for _, p in parents(layer, i, width)]) for i in range(width)]
        ray.get(prev)
        return layers * width / (time.perf_counter() - started)
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--width", type=int, default=100)
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument("--skip-peers", action="store_true")
    add_store_options(parser)
    args = parser.parse_args()
    check_store_options(parser, args)
    orrery = run_orrery(args.layers, args.width, args.devices, args)
    dask = ray_ = None
    if not args.skip_peers:
        dask = run_dask(args.layers, args.width)
        ray_ = run_ray(args.layers, args.width)
    n = args.layers * args.width
    print(f"\n{n}-node layered DAG ({args.layers} x {args.width}, 2 parents each)\n")
    print(f"{'system':58} {'nodes/s':>9} {'vs Orrery':>10}")
    store = describe(args.store, args.replicas, args.redis)
    rows = [(f"Orrery, {args.devices} simulated devices", orrery["nodes_per_s"])]
    if dask:
        rows.append(("Dask distributed, 2 single-threaded workers (in memory)", dask))
    if ray_:
        rows.append(("Ray, num_cpus=2 (in memory)", ray_))
    for name, rate in rows:
        print(f"{name:58} {rate:>9.0f} {rate / orrery['nodes_per_s']:>9.2f}x")
    rss = ", ".join(f"{mb:.0f}" for mb in orrery["replica_peak_rss_mb"])
    print(f"\nOrrery on {store}: {orrery['seconds']:.2f}s end to end, peak RSS per replica {rss} MB")
    print(json.dumps({"orrery": orrery, "dask_nodes_per_s": dask, "ray_nodes_per_s": ray_, **labels(args)}))


if __name__ == "__main__":
    main()
