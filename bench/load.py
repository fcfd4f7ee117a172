"""Under load: simulated devices on replicas, a mix of chains, fan-outs and short DAGs at 50 % and
90 % of the measured maximum throughput, and how long work waits.

The orchestrator runs as `--replicas` real `orrery serve` replicas on a throwaway durable Postgres
and Redis (bench/stores.py; `--store sqlite --replicas 1` runs it on one process's SQLite file).
`--devices` simulated devices (tests/simdevice.py: real protocol clients, accepting a quick batch
by its results as the agent does) live in `--hosts` processes of their own, spread over the
replicas in turn, in groups of ten (label `group`). The mix, in turn:
- a chain of four no-op nodes;
- a fan-out: one node `for_each` over a group's ten devices;
- a short DAG: one node, three after it, one after those (a diamond of five).
Throughput is counted in batches (a fan-out's child is one).

First the maximum: `--probe-tasks` tasks of the mix are submitted at once, and the maximum is
their batches over the time from the first submission to the last task's end. Then, for each
level of `--levels` (percent of that maximum), tasks are submitted open-loop at that rate of
batches for `--seconds` (from a pool of submitting threads, to the replicas in turn, so a slow
answer does not hold the schedule back), and the run waits for every task to end. Reported per
level:
- dispatch latency: a node (or fan-out child) ready, to its batch received on the device. "Ready"
  is the `at` of the node's `ready` event (a child's `node.child` ready), which the engine stamps
  at the start of the step that made it ready; "received" is the wall clock on the device when
  its batch arrived (one machine, one clock). Goals: p99 within 100 ms at 50 %, 500 ms at 90 %;
- end-to-end task latency: the POST sent, to the task's terminal event;
- per replica: CPU seconds over the level's run, and peak RSS (sampled every 0.2 s).

    python bench/load.py [--devices 1000] [--replicas 3] [--store postgres] [--seconds 30]
                         [--levels 50,90] [--probe-tasks 150] [--hosts 1]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import resource
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.devices import proc_stat
from bench.hosts import HostPool
from bench.stores import Cluster, add_store_options, check_store_options, describe, from_args, labels
from tests.simdevice import SimFleet
from tests.support import TASK_ENDS, wait_until

GROUP = 10  # devices per `group` label: a fan-out's width
GOALS_MS = {50: 100.0, 90: 500.0}  # dispatch p99 at this percent of the maximum
NOOP = [{"tool": "sim.noop", "arguments": {}}]
SUBMITTERS = 8  # threads posting tasks


# ------------------------------------------------------------------------------- the mix


def chain() -> dict[str, Any]:
    ids = [f"c{i}" for i in range(4)]
    return {
        "nodes": [{"id": n, "commands": NOOP} for n in ids],
        "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
    }


def fan_out(group: int) -> dict[str, Any]:
    return {"nodes": [{"id": "f", "for_each": {"labels": {"group": f"g{group}"}}, "commands": NOOP}]}


def diamond() -> dict[str, Any]:
    middle = ["b0", "b1", "b2"]
    return {
        "nodes": [{"id": n, "commands": NOOP} for n in ["a", *middle, "z"]],
        "edges": [{"from": "a", "to": m} for m in middle] + [{"from": m, "to": "z"} for m in middle],
    }


def mix(groups: int) -> Iterator[tuple[dict[str, Any], int]]:
    """(DAG, its batches), endlessly: a chain, a fan-out over the next group, a diamond."""
    for k in itertools.count():
        yield chain(), 4
        yield fan_out(k % groups), GROUP
        yield diamond(), 5


# ------------------------------------------------------------------------------- the devices


class Hosts(HostPool):
    """The simulated devices, spread over `processes` host processes (bench/hosts.py)."""

    def __init__(self, devices: list[tuple[str, dict[str, Any], dict[str, str]]], processes: int) -> None:
        super().__init__(_host, [(devices[k::processes],) for k in range(processes)])

    def arrivals(self) -> dict[str, float]:
        """batch id -> when it reached its device (time.time()), for every batch so far."""
        out: dict[str, float] = {}
        for part in self.ask("arrivals"):
            out.update(part)
        return out


def _host(devices: list[tuple[str, dict[str, Any], dict[str, str]]], pipe: Connection) -> None:
    import uvloop

    sims = SimFleet(uvloop.new_event_loop())
    for url, enrolled, device_labels in devices:
        sims.add(url, enrolled, labels=device_labels, wait=False, accept_by_results=True)
    while True:
        command = pipe.recv()
        if command == "connected":
            pipe.send(sum(1 for d in sims.devices if d.welcomed.is_set()))
        elif command == "arrivals":
            pipe.send({e.batch_id: e.started for d in sims.devices for e in list(d.executions)})
        elif command == "stop":
            sims.close()
            pipe.send("stopped")
            return


async def enroll(fleet: Cluster, count: int) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {fleet.server.api_key}"}
    sem = asyncio.Semaphore(32)
    async with httpx.AsyncClient(base_url=fleet.server.url, headers=headers, timeout=60) as c:

        async def one(i: int) -> dict[str, Any]:
            async with sem:
                body = {"name": f"d{i:05d}", "labels": {"group": f"g{i // GROUP}"}}
                r = await c.post("/v1/devices", json=body)
                assert r.status_code == 201, r.text
                enrolled: dict[str, Any] = r.json()
                return enrolled

        return list(await asyncio.gather(*(one(i) for i in range(count))))


# ------------------------------------------------------------------------------- a run


@dataclass
class Submitted:
    task_id: str
    sent: float  # time.time() as the POST went out
    batches: int


@dataclass
class Usage:
    """Each replica's CPU and peak RSS while sampling."""

    pids: list[int]
    cpu0: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    peak_rss: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Usage:
        self.cpu0 = [proc_stat(pid)[0] for pid in self.pids]
        self.peak_rss = [proc_stat(pid)[1] for pid in self.pids]

        def sample() -> None:
            while not self._stop.wait(0.2):
                for i, pid in enumerate(self.pids):
                    self.peak_rss[i] = max(self.peak_rss[i], proc_stat(pid)[1])

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.cpu = [proc_stat(pid)[0] - c0 for pid, c0 in zip(self.pids, self.cpu0, strict=True)]


class Submitter:
    """Posts tasks from a pool of threads, to the replicas in turn."""

    def __init__(self, fleet: Cluster) -> None:
        headers = {"Authorization": f"Bearer {fleet.server.api_key}"}
        self.clients = [httpx.Client(base_url=s.url, headers=headers, timeout=120) for s in fleet.servers]
        self.pool = ThreadPoolExecutor(SUBMITTERS)
        self.turn = itertools.count()

    def submit(self, dag: dict[str, Any], batches: int) -> Future[Submitted]:
        client = self.clients[next(self.turn) % len(self.clients)]

        def post() -> Submitted:
            sent = time.time()
            r = client.post("/v1/tasks", json={"dag": dag})
            assert r.status_code == 201, r.text
            return Submitted(r.json()["id"], sent, batches)

        return self.pool.submit(post)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for c in self.clients:
            c.close()


def task_events(fleet: Cluster, after_id: int) -> list[tuple[int, str, str | None, dict[str, Any]]]:
    """(id, type, node id, data) of every event after `after_id`, read from the store itself."""
    rows = _query(fleet, "SELECT id, type, node_id, data FROM events WHERE id > {} ORDER BY id", after_id)
    return [(int(r[0]), r[1], r[2], json.loads(r[3]) if isinstance(r[3], str) else r[3]) for r in rows]


def last_event_id(fleet: Cluster) -> int:
    return int(_query(fleet, "SELECT coalesce(max(id), 0) FROM events WHERE id > {}", 0)[0][0])


def _query(fleet: Cluster, sql: str, arg: int) -> list[Any]:
    """Rows of one read of the store (`{}`: the placeholder of its one argument)."""
    if fleet.store == "sqlite":
        import sqlite3

        db = sqlite3.connect(fleet.server.data_dir / "orrery.db")
        try:
            rows = db.execute(sql.format("?"), (arg,)).fetchall()
        finally:
            db.close()
    else:
        from tests.services import asyncpg_dsn, run_async

        async def read() -> list[Any]:
            import asyncpg

            conn = await asyncpg.connect(asyncpg_dsn(fleet.env["ORRERY_DATABASE_URL"]))
            try:
                return list(await conn.fetch(sql.format("$1"), arg))
            finally:
                await conn.close()

        rows = run_async(read())
    return rows


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@dataclass
class Outcome:
    tasks: int
    batches: int
    seconds: float  # first POST to the last task's end
    dispatch_ms: list[float]
    task_ms: list[float]
    failed: int
    usage: Usage


def run_tasks(
    fleet: Cluster, hosts: Hosts, work: Iterator[tuple[dict[str, Any], int]], rate: float | None, seconds: float,
    count: int,
) -> Outcome:  # fmt: skip
    """Submit `count` tasks at once (`rate` None) or tasks at `rate` batches/s for `seconds`;
    wait for all of them to end; their latencies."""
    after = last_event_id(fleet)
    submitter = Submitter(fleet)
    futures: list[Future[Submitted]] = []
    with Usage(fleet.pids()) as usage:
        started = time.time()
        if rate is None:
            futures = [submitter.submit(dag, n) for dag, n in itertools.islice(work, count)]
        else:
            due = time.monotonic()
            end = due + seconds
            while due < end:
                dag, n = next(work)
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                futures.append(submitter.submit(dag, n))
                due += n / rate
        submitted = [f.result() for f in futures]
        submitter.close()
        ids = {s.task_id for s in submitted}
        ended: dict[str, tuple[float, str]] = {}

        def all_ended() -> bool:
            nonlocal after_seen
            for event_id, kind, node_id, data in task_events(fleet, after_seen):
                after_seen = event_id
                events.append((event_id, kind, node_id, data))
                terminal = kind == "task.state" and node_id is None and data["state"] in TASK_ENDS
                if terminal and data["task_id"] in ids:
                    ended[data["task_id"]] = (_at(data["at"]), data["state"])
            return ids <= ended.keys()

        events: list[tuple[int, str, str | None, dict[str, Any]]] = []
        after_seen = after
        wait_until(all_ended, max(120.0, 4 * seconds), f"the {len(ids)} tasks to end", interval=0.25)
    arrivals = hosts.arrivals()
    ready: dict[tuple[str, str, str | None], float] = {}  # (task, node, device for a child) -> ready at
    dispatch: list[float] = []
    for _, kind, node_id, data in events:
        if data.get("task_id") not in ids or node_id is None:
            continue
        key = (data["task_id"], node_id, data.get("device_id") if kind == "node.child" else None)
        if kind in ("node.state", "node.child") and data.get("state") == "ready":
            ready[key] = _at(data["at"])
        elif kind == "node.attempt" and data.get("state") == "dispatched":
            received = arrivals.get(data["batch_id"])
            child = (data["task_id"], node_id, data.get("device_id"))  # a fan-out's child, if it is one
            since = ready.get(child, ready.get(key))
            if received is not None and since is not None:
                dispatch.append((received - since) * 1000)
    finished = max(at for at, _ in ended.values())
    return Outcome(
        tasks=len(submitted),
        batches=sum(s.batches for s in submitted),
        seconds=finished - started,
        dispatch_ms=dispatch,
        task_ms=[(ended[s.task_id][0] - s.sent) * 1000 for s in submitted],
        failed=sum(1 for _, state in ended.values() if state != "succeeded"),
        usage=usage,
    )


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# ------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000, help=f"simulated devices (a multiple of {GROUP})")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each level submits work")
    parser.add_argument("--levels", default="50,90", help="percent of the measured maximum, comma-separated")
    parser.add_argument("--probe-tasks", type=int, default=150, help="tasks submitted at once to find the maximum")
    parser.add_argument("--hosts", type=int, default=1, help="processes hosting the simulated devices")
    add_store_options(parser)
    parser.set_defaults(store="postgres", replicas=3)
    args = parser.parse_args()
    check_store_options(parser, args)
    if args.devices < GROUP or args.devices % GROUP:
        parser.error(f"--devices: a multiple of {GROUP} (the fan-outs run over groups of {GROUP})")
    try:
        levels = [int(x) for x in args.levels.split(",")]
    except ValueError:
        parser.error(f"--levels: percents, comma-separated (got {args.levels!r})")
    if not levels or any(not 0 < x <= 100 for x in levels):
        parser.error("--levels: each between 1 and 100")
    if args.seconds <= 0 or args.probe_tasks < 3 or args.hosts < 1:
        parser.error("--seconds above 0, --probe-tasks at least 3, --hosts at least 1")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    groups = args.devices // GROUP
    with from_args(args, handshakes_per_minute="1000000", max_nodes_per_task="100") as fleet:
        enrolled = asyncio.run(enroll(fleet, args.devices))
        devices = [
            (fleet.device_url(i), e, {"group": f"g{i // GROUP}"}) for i, e in enumerate(enrolled)
        ]  # fmt: skip
        hosts = Hosts(devices, args.hosts)
        try:
            wait_until(lambda: hosts.connected() == args.devices, 600, "every device to connect", interval=0.5)
            print(f"  {args.devices} devices connected; finding the maximum", file=sys.stderr)
            work = mix(groups)
            probe = run_tasks(fleet, hosts, work, None, 0.0, args.probe_tasks)
            maximum = probe.batches / probe.seconds
            results = []
            for level in levels:
                rate = maximum * level / 100
                print(f"  {level} %: {rate:.0f} batches/s for {args.seconds:g} s", file=sys.stderr)
                results.append((level, rate, run_tasks(fleet, hosts, work, rate, args.seconds, 0)))
        finally:
            hosts.close()

    where = describe(args.store, args.replicas, args.redis)
    print(f"\n{args.devices} simulated devices on {where}; mix: chain of 4, fan-out over {GROUP}, diamond of 5")
    print(
        f"maximum: {maximum:.0f} batches/s ({probe.batches} batches of {probe.tasks} tasks submitted at once, "
        f"{probe.seconds:.2f} s)\n"
    )
    print(
        f"{'load':>5} {'offered/s':>10} {'done/s':>8} {'tasks':>6} {'dispatch p50':>13} {'p99 ms':>8} "
        f"{'goal':>6} {'':7} {'task p50':>9} {'p99 ms':>8}"
    )
    figures = []
    for level, rate, out in results:
        d50, d99 = pct(out.dispatch_ms, 0.5), pct(out.dispatch_ms, 0.99)
        goal = GOALS_MS.get(level)
        held = None if goal is None else d99 <= goal
        verdict = "" if held is None else ("held" if held else "MISSED")
        goal_text = "-" if goal is None else f"{goal:.0f}"
        print(
            f"{level:>4}% {rate:>10.0f} {out.batches / out.seconds:>8.0f} {out.tasks:>6} {d50:>13.1f} {d99:>8.1f} "
            f"{goal_text:>6} {verdict:7} {pct(out.task_ms, 0.5):>9.1f} {pct(out.task_ms, 0.99):>8.1f}"
        )
        figures.append(
            {
                "level": level,
                "offered_batches_per_s": rate,
                "done_batches_per_s": out.batches / out.seconds,
                "tasks": out.tasks,
                "failed": out.failed,
                "dispatch_samples": len(out.dispatch_ms),
                "dispatch_p50_ms": d50,
                "dispatch_p99_ms": d99,
                "task_p50_ms": pct(out.task_ms, 0.5),
                "task_p99_ms": pct(out.task_ms, 0.99),
                "goal_dispatch_p99_ms": goal,
                "goal_held": held,
                "replica_cpu_s": out.usage.cpu,
                "replica_peak_rss_mb": out.usage.peak_rss,
            }
        )
    print(f"\n{'per replica':12}" + "".join(f"{f'{lv} %: CPU s, peak RSS MB':>28}" for lv, _, _ in results))
    for i in range(len(fleet.servers)):
        cells = "".join(f"{f'{o.usage.cpu[i]:.1f}, {o.usage.peak_rss[i]:.0f}':>28}" for _, _, o in results)
        print(f"{f'replica {i}':12}{cells}")
    failed = sum(f["failed"] for f in figures) + probe.failed
    if failed:
        print(f"\n{failed} task(s) did not succeed")
    print(
        json.dumps(
            {"devices": args.devices, "max_batches_per_s": maximum, "levels": figures, "failed": failed, **labels(args)}
        )
    )


if __name__ == "__main__":
    main()
