"""A fan-out over many simulated devices: one node, `for_each` over every device with a
label, with canaries, a parallelism cap and verify commands, against a real `orrery serve` with
its durable SQLite store. Each device is a real protocol client over a WebSocket (all of them in
this process, tests/simdevice.py). Reported: time from the POST to the finished task, the time
the canaries took, the server's CPU over that time (seconds, and share of one core) and its
peak RSS, and that every device ran the command exactly once and its verify command once.

With `--store postgres` the orchestrator runs on a throwaway durable Postgres, with
`--replicas N` as N replicas (and Redis), the devices spread over them in turn (bench/stores.py);
the CPU and RSS figures are then per replica, and `server_cpu_s` their sum.

    python bench/fanout.py [--devices 500] [--canary 10] [--max-parallel 0] [--no-verify]
                           [--store sqlite|postgres] [--replicas N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench.dag_throughput import peak_rss_mb
from bench.stores import add_store_options, check_store_options, describe, from_args, labels
from tests.simdevice import SimFleet

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def node(canary: int, max_parallel: int, verify: bool) -> dict[str, Any]:
    fan: dict[str, Any] = {"labels": {"role": "web"}, "canary": canary}
    if max_parallel:
        fan["max_parallel"] = max_parallel
    spec: dict[str, Any] = {"id": "rollout", "for_each": fan, "commands": [{"tool": "sim.act", "arguments": {}}]}
    if verify:
        spec["verify"] = [{"tool": "sim.noop", "arguments": {}}]
    return spec


def run(devices: int, canary: int, max_parallel: int, verify: bool, args: argparse.Namespace) -> dict[str, Any]:
    with from_args(args) as fleet:
        sims = SimFleet(uvloop.new_event_loop())
        try:
            for i in range(devices):
                enrolled = fleet.enroll(f"web-{i:04d}", {"role": "web"})
                sims.add(fleet.device_url(i), enrolled, labels={"role": "web"})
            pids = fleet.pids()
            cpu0, started = [cpu_s(pid) for pid in pids], time.perf_counter()
            task = fleet.submit({"nodes": [node(canary, max_parallel, verify)]})
            done = fleet.wait_task(task["id"], timeout=3600)
            elapsed = time.perf_counter() - started
            cpus = [cpu_s(pid) - c0 for pid, c0 in zip(pids, cpu0, strict=True)]
            cpu = sum(cpus)
            assert done["state"] == "succeeded", done["state"]
            children = done["nodes"][0]["children"]
            assert len(children) == devices and all(c["state"] == "succeeded" for c in children)
            runs = [sum(1 for e in d.executions if e.node_id == "rollout") for d in sims.devices]
            assert runs == [2 if verify else 1] * devices, f"executions per device: {sorted(set(runs))}"
            canaries = children[:canary]
            canary_s = max(_at(a["ended_at"]) for c in canaries for a in c["attempts"]) - _at(done["created_at"])
            return {
                "devices": devices,
                "seconds": elapsed,
                "canary_seconds": canary_s,
                "children_per_s": devices / elapsed,
                "server_cpu_s": cpu,
                "server_cpu_share": cpu / elapsed,
                "server_peak_rss_mb": max(peak_rss_mb(pid) for pid in pids),
                "replica_cpu_s": cpus,
                "replica_peak_rss_mb": [peak_rss_mb(pid) for pid in pids],
            }
        finally:
            sims.close()


def _at(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--canary", type=int, default=10)
    parser.add_argument("--max-parallel", type=int, default=0, help="0: no cap")
    parser.add_argument("--no-verify", action="store_true")
    add_store_options(parser)
    args = parser.parse_args()
    check_store_options(parser, args)
    out = run(args.devices, args.canary, args.max_parallel, not args.no_verify, args)
    cap = args.max_parallel or "none"
    verify = "sim.noop" if not args.no_verify else "none"
    print(
        f"\nfan-out over {args.devices} simulated devices (canary {args.canary}, max_parallel {cap}, verify {verify})"
    )
    print(f"orchestrator on {describe(args.store, args.replicas, args.redis)}\n")
    print(f"{'finished (POST to task succeeded)':40} {out['seconds']:>8.2f} s")
    print(f"{'canaries done':40} {out['canary_seconds']:>8.2f} s")
    print(f"{'children per second':40} {out['children_per_s']:>8.0f}")
    print(f"{'server CPU':40} {out['server_cpu_s']:>8.2f} s ({out['server_cpu_share']:.0%} of a core)")
    print(f"{'server peak RSS':40} {out['server_peak_rss_mb']:>8.0f} MB")
    if args.replicas > 1:
        for i, (cpu, rss) in enumerate(zip(out["replica_cpu_s"], out["replica_peak_rss_mb"], strict=True)):
            print(f"{f'  replica {i}: CPU s, peak RSS MB':40} {cpu:>8.2f}   {rss:.0f}")
    print(json.dumps({**out, **labels(args)}))


if __name__ == "__main__":
    main()
