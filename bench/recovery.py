"""Crash recovery: 1,000 nodes in flight, kill -9 the orchestrator, restart it on the same store.

Measures, from the restart: the API ready (`/readyz` answers 200), every device reconnected,
every node that was in flight at the kill terminal or running again (its device back, so the
batch is re-sent or its result re-delivered), and every node terminal. Checks that none was lost
(all succeeded) and none ran twice (each simulated device counts its executions by node). The
simulated devices reconnect as the agent does (`--policy backoff`: device_agent.reconnect.Backoff;
`old`: tenacity's wait_random_exponential(0.5, max=30); `fixed`: every 0.2 s).

With `--store postgres` the orchestrator runs on a throwaway durable Postgres (bench/stores.py).
With `--replicas N` (N > 1, with Redis) the devices are spread over the replicas in turn, and the
replica that leads the engine is killed (-9) and not restarted: the devices it held dial the next
replica, as an agent with `--also-server` does, and another replica takes the engine lease as
soon as the dead one's Postgres session is gone (within a follower's half-second try; the lease's
expiry, `--lease-ttl-s`, only for a leader that hangs). The times are then counted from
the kill, and "the API is ready" is "another replica leads"; a node in flight is running again
once its device is linked to a live replica and a replica leads.

    python bench/recovery.py [--nodes 1000] [--devices 100] [--seconds 1.5] [--policy backoff]
                             [--store sqlite|postgres] [--replicas N] [--lease-ttl-s S]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.reconnect import make_policy
from bench.stores import add_store_options, check_store_options, describe, from_args, labels
from tests.simdevice import SimFleet
from tests.support import Fleet, Server, wait_until

GOAL_S = 5.0  # API ready and every in-flight node terminal or running again within this


class Events:
    """A task's event stream read in a thread: when (wall clock) each node reached each state."""

    def __init__(self, fleet: Fleet, task_id: str) -> None:
        self.terminal: dict[str, float] = {}
        self.task_ended: float | None = None
        self._thread = threading.Thread(target=self._read, args=(fleet, task_id), daemon=True)
        self._thread.start()

    def _read(self, fleet: Fleet, task_id: str) -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            fleet.server.client() as c,
            c.stream("GET", f"/v1/tasks/{task_id}/events", timeout=httpx.Timeout(3600, connect=10)) as resp,
        ):
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = json.loads(line[5:])
                at = datetime.fromisoformat(data["at"]).timestamp()
                if data.get("node_id") is None:
                    if data.get("state") in ("succeeded", "failed", "cancelled"):
                        self.task_ended = at
                        return
                elif data.get("state") in ("succeeded", "failed", "skipped", "cancelled"):
                    self.terminal.setdefault(data["node_id"], at)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=1.5, help="how long each node runs on its device")
    parser.add_argument("--policy", choices=("backoff", "old", "fixed"), default="backoff")
    parser.add_argument("--lease-ttl-s", type=float, default=None, help="the engine lease's lifetime (replicas)")
    add_store_options(parser)
    args = parser.parse_args()
    check_store_options(parser, args)
    if args.lease_ttl_s is not None and args.replicas < 2 and not args.redis:
        parser.error("--lease-ttl-s is for replicas (--replicas 2 or more)")
    settings = {"max_nodes_per_task": str(args.nodes), "heartbeat_interval_s": "2", "heartbeat_timeout_s": "30"}
    if args.lease_ttl_s is not None:
        settings["lease_ttl_s"] = str(args.lease_ttl_s)
    failover = args.replicas > 1
    with from_args(args, **settings) as fleet:
        sims = SimFleet()
        try:
            home: dict[str, str] = {}  # device id -> the replica URL it dials
            for i in range(args.devices):
                policy = None if args.policy == "fixed" else make_policy(args.policy)
                device = sims.add(fleet.device_url(i), fleet.enroll(f"sim-{i:03d}"), reconnect=policy)
                home[device.device_id] = fleet.device_url(i)
            dag = {
                "nodes": [
                    {"id": f"n{i}", "commands": [{"tool": "sim.sleep", "arguments": {"seconds": args.seconds}}]}
                    for i in range(args.nodes)
                ]
            }
            task = fleet.submit(dag)
            wait_until(lambda: sum(len(d.executions) for d in sims.devices) >= args.devices, 120, "devices busy")
            before = fleet.task(task["id"])
            in_flight = {
                n["id"]: n["attempts"][-1]["device_id"]
                for n in before["nodes"]
                if n["state"] == "running" and n["attempts"]
            }
            at_kill = collections.Counter(n["state"] for n in before["nodes"])

            victim = fleet.leader()
            lost_link = {d for d, url in home.items() if not failover or url == victim.url}
            if failover:
                survivors = [s for s in fleet.servers if s is not victim]
                fleet.use(survivors[0])  # the API from a replica that lives on
                victim.kill()  # SIGKILL
                killed_wall = time.time()
                restarted, restarted_wall = time.monotonic(), killed_wall
                moved = _fail_over(sims, victim, survivors)
                fleet.leader(timeout=600)
            else:
                moved = args.devices
                victim.kill()  # SIGKILL
                killed_wall = time.time()
                victim.launch()
                restarted, restarted_wall = time.monotonic(), time.time()
                victim.wait_ready()
            ready = time.monotonic() - restarted
            events = Events(fleet, task["id"])
            back = {d.device_id: d for d in sims.devices}

            def reconnected(device_id: str) -> float | None:
                """Seconds from the restart (or the kill) until the device was linked again."""
                if device_id not in lost_link:
                    return 0.0  # its replica lives on: its link never went
                later = [t for t in back[device_id].welcomes if t > restarted]
                return later[0] - restarted if later else None

            wait_until(
                lambda: all(reconnected(d) is not None for d in back), 600, "every device to reconnect", interval=0.1
            )
            done = fleet.wait_task(task["id"], timeout=3600)
            events.join(30)
            all_terminal = (events.task_ended or time.time()) - restarted_wall
            devices_back = max(reconnected(d) or 0.0 for d in back)

            def resolved(node_id: str) -> float:
                """Seconds from the restart until an in-flight node was terminal or running again."""
                ended = events.terminal.get(node_id)
                if ended is not None and ended <= killed_wall:
                    return 0.0
                back_at = reconnected(in_flight[node_id])  # (0.0: its link never went)
                times = [max(ready, float("inf") if back_at is None else back_at)]
                if ended is not None:
                    times.append(ended - restarted_wall)
                return max(0.0, min(times))

            in_flight_back = max((resolved(n) for n in in_flight), default=0.0)
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
    print(
        f"\n{args.nodes} nodes on {args.devices} simulated devices, each running {args.seconds}s; "
        f"devices reconnect with the {args.policy!r} policy;\norchestrator on "
        f"{describe(args.store, args.replicas, args.redis)}"
    )
    print(f"at the kill: {dict(at_kill)} ({len(in_flight)} running on devices)\n")
    if failover:
        print(f"kill -9 the leader (not restarted; its {moved} devices dial the next replica); from the kill until")
        labels_ = ("  another replica leads the engine", "  every device is linked to a live replica")
    else:
        print("from the restart (kill -9, then start on the same store) until")
        labels_ = ("  the API is ready (/readyz 200)", "  every device has reconnected")
    print(f"{'':64} {'seconds':>8}")
    print(f"{labels_[0]:64} {ready:>8.2f}")
    print(f"{labels_[1]:64} {devices_back:>8.2f}")
    print(f"{'  every node in flight at the kill is terminal or running again':64} {in_flight_back:>8.2f}")
    print(f"{'  every node is terminal':64} {all_terminal:>8.2f}")
    print(f"\nlost: {lost}   ran twice: {twice}   final states: {dict(states)}")
    met = ready <= GOAL_S and in_flight_back <= GOAL_S
    print(
        f"goal (API ready and every in-flight node terminal or running again within {GOAL_S:g} s of the "
        f"{'kill' if failover else 'restart'}): {'met' if met else 'NOT met'}"
    )
    if errors:
        print(f"errors: {dict(errors)}")
        for n in samples:
            print(" ", n["id"], n["error"], [(a["status"], a["error"]) for a in n["attempts"]])
    figures = {
        "ready_s": ready,
        "devices_back_s": devices_back,
        "in_flight_back_s": in_flight_back,
        "all_terminal_s": all_terminal,
        "in_flight": len(in_flight),
        "lost": lost,
        "ran_twice": twice,
        "goal_met": met,
    }
    print(json.dumps({**figures, **labels(args)}))


def _fail_over(sims: SimFleet, dead: Server, survivors: list[Server]) -> int:
    """Point the devices that dialled `dead` at the next replica (the agent's `--also-server`
    failover: the next server in its list); how many moved."""
    moved = 0
    dead_ws = dead.url.replace("http://", "ws://") + "/v1/agent"
    for k, device in enumerate(d for d in sims.devices if d.url == dead_ws):
        target = survivors[k % len(survivors)]
        device.url = target.url.replace("http://", "ws://") + "/v1/agent"  # read at its next dial
        moved += 1
    return moved


if __name__ == "__main__":
    main()
