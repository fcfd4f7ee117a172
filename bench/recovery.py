"""Crash recovery: 1,000 nodes in flight, kill -9 the orchestrator, restart it on the same store.

Measures the time from the restart until every node is terminal, and checks that none was lost
(all succeeded) and none ran twice (each simulated device counts its executions by node).

    python bench/recovery.py [--nodes 1000] [--devices 100] [--seconds 1.5]
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.simdevice import SimFleet
from tests.support import Fleet, wait_until


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=1.5, help="how long each node runs on its device")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Fleet(
            Path(tmp), max_nodes_per_task=str(args.nodes), heartbeat_interval_s="2", heartbeat_timeout_s="30"
        ) as fleet,
    ):
        sims = SimFleet()
        try:
            for i in range(args.devices):
                sims.add(fleet.server.url, fleet.enroll(f"sim-{i:03d}"))
            dag = {
                "nodes": [
                    {"id": f"n{i}", "commands": [{"tool": "sim.sleep", "arguments": {"seconds": args.seconds}}]}
                    for i in range(args.nodes)
                ]
            }
            task = fleet.submit(dag)
            wait_until(lambda: sum(len(d.executions) for d in sims.devices) >= args.devices, 120, "devices busy")
            in_flight = _counts(fleet, task["id"])
            fleet.server.kill(signal.SIGKILL)
            restarted = time.perf_counter()
            fleet.server.start()
            done = fleet.wait_task(task["id"], timeout=3600)
            elapsed = time.perf_counter() - restarted
            runs = collections.Counter(e.node_id for d in sims.devices for e in d.executions)
            states = collections.Counter(n["state"] for n in done["nodes"])
            errors = collections.Counter(
                (n["error"] or {}).get("code") for n in done["nodes"] if n["state"] != "succeeded"
            )
            samples = [n for n in done["nodes"] if n["state"] != "succeeded"][:2]
        finally:
            sims.close()
    twice = sum(1 for c in runs.values() if c > 1)
    lost = args.nodes - states.get("succeeded", 0)
    print(f"\n{args.nodes} nodes on {args.devices} simulated devices, each running {args.seconds}s")
    print(f"at the kill: {dict(in_flight)}")
    print(f"restart to every node terminal: {elapsed:.2f}s (includes the server's own start-up)")
    print(f"lost: {lost}   ran twice: {twice}   final states: {dict(states)}")
    if errors:
        print(f"errors: {dict(errors)}")
        for n in samples:
            print(" ", n["id"], n["error"], [(a["status"], a["error"]) for a in n["attempts"]])


def _counts(fleet: Fleet, task_id: str) -> collections.Counter[str]:
    return collections.Counter(n["state"] for n in fleet.task(task_id)["nodes"])


if __name__ == "__main__":
    main()
