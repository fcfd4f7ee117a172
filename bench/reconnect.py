"""Reconnect storm: 1,000 devices on one orchestrator, kill -9 it, restart it, watch them come back.

The devices are simulated (tests/simdevice.py: real WebSocket protocol clients, many in this one
process) and pace their reconnects exactly as the agent's loop does, with one of two policies:

- `backoff`: `device_agent.reconnect.Backoff` (full jitter, 2 s cap while an outage is young);
- `old`: the agent's earlier policy, tenacity's `wait_random_exponential(multiplier=0.5, max=30)`
  per attempt (0.5 s doubling to a 30 s cap).

Both run in the same invocation against the same server and store, one after the other. For each:
restart to `/readyz` 200, the accept rate over time (completed handshakes per bucket), the
server's CPU during the reconnect (from /proc/<pid>/stat), and the time until all devices are back
(welcomed, and the server's `orrery_websocket_connections_open` gauge at the device count). All devices dial from
127.0.0.1, so the server's per-address handshake limit is raised (`--handshakes-per-minute`).

With `--store postgres` the orchestrator runs on a throwaway durable Postgres and is restarted on
the same database; with `--replicas N` (and Redis) the devices are spread over N replicas in turn
and every replica is killed (-9) and restarted at once, a whole cluster's restart: readiness is
every replica's `/readyz`, the gauge and the CPU their sums (bench/stores.py).

    python bench/reconnect.py [--devices 1000] [--down 0] [--bucket 0.25] [--policies backoff,old]
                              [--store sqlite|postgres] [--replicas N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from tenacity import RetryCallState, wait_random_exponential

from bench.devices import enroll, proc_stat
from bench.hosts import HostPool
from bench.stores import Cluster, add_store_options, check_store_options, describe, from_args, labels
from device_agent.reconnect import Backoff
from tests.simdevice import STABLE_SESSION_S, ReconnectPolicy, SimDevice, SimFleet
from tests.support import wait_until

GAUGE = "orrery_websocket_connections_open"  # the server's count of open device WebSockets
POLICIES = {
    "backoff": "Backoff (2 s cap early)",
    "old": "old (tenacity, 30 s cap)",
}


class TenacityPolicy:
    """The agent's reconnect policy before `Backoff`: one tenacity `AsyncRetrying` per outage with
    `wait_random_exponential(multiplier=0.5, max=30)`, the attempt count restarting after a stable
    session (device_agent/agent.py at aab80d4)."""

    def __init__(self) -> None:
        self._wait = wait_random_exponential(multiplier=0.5, max=30)
        self._attempt = 0

    def next_delay(self) -> float:
        self._attempt += 1
        return float(self._wait(cast(RetryCallState, SimpleNamespace(attempt_number=self._attempt))))

    def reset(self) -> None:
        self._attempt = 0


def make_policy(name: str) -> ReconnectPolicy:
    return Backoff() if name == "backoff" else TenacityPolicy()


@dataclass
class Run:
    policy: str
    devices: int
    killed: float = 0.0
    launched: float = 0.0
    ready: float = 0.0
    all_welcomed: float | None = None
    gauge_full: float | None = None
    accepts: list[float] = field(default_factory=list)
    attempts: list[float] = field(default_factory=list)
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (time, server CPU seconds)
    client_cpu_s: float = 0.0

    def after(self, t: float | None) -> str:
        return "never" if t is None else f"{t - self.launched:.2f}"

    def rate(self, start: float, end: float) -> float:
        return sum(1 for t in self.accepts if start <= t < end) / (end - start)

    def cpu_percent(self, start: float, end: float) -> float | None:
        """The server's CPU use between two instants (% of one core), interpolating the samples."""
        a, b = self._cpu_at(start), self._cpu_at(end)
        return None if a is None or b is None or end <= start else 100 * (b - a) / (end - start)

    def _cpu_at(self, t: float) -> float | None:
        before = [(ts, c) for ts, c in self.cpu if ts <= t]
        after = [(ts, c) for ts, c in self.cpu if ts >= t]
        if not before or not after:
            return None
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def gauge(url: str) -> int | None:
    try:
        text = httpx.get(f"{url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{GAUGE} "):
            return int(float(line.split()[1]))
    return None


def gauges(urls: list[str]) -> int:
    """The open-sockets gauge summed over the replicas (one not answering counts 0)."""
    return sum(gauge(url) or 0 for url in urls)


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class Hosts(HostPool):
    """The simulated devices, spread over `processes` host processes (bench/hosts.py); their
    time.monotonic() is the system's CLOCK_MONOTONIC, so their timestamps and ours share one axis."""

    def __init__(self, urls: list[str], enrolled: list[dict[str, Any]], policy: str, processes: int) -> None:
        shares = [(urls[k::processes], enrolled[k::processes], policy) for k in range(processes)]
        super().__init__(_host, shares)

    def timestamps(self) -> tuple[list[list[float]], list[list[float]]]:
        """(welcomes, attempts) of every device."""
        welcomes, attempts = [], []
        for w, a in self.ask("timestamps"):
            welcomes += w
            attempts += a
        return welcomes, attempts

    def cpu_seconds(self) -> float:
        return sum(proc_stat(p.pid)[0] for p in self.procs if p.pid)


def _host(urls: list[str], enrolled: list[dict[str, Any]], policy: str, pipe: Connection) -> None:
    sims = SimFleet()
    for url, e in zip(urls, enrolled, strict=True):
        sims.add(url, e, wait=False, reconnect=make_policy(policy))
    devices: list[SimDevice] = sims.devices
    while True:
        command = pipe.recv()
        if command == "connected":
            pipe.send(sum(1 for d in devices if d.welcomed.is_set()))
        elif command == "timestamps":
            pipe.send(([list(d.welcomes) for d in devices], [list(d.attempts) for d in devices]))
        elif command == "stop":
            sims.close()
            pipe.send("stopped")
            return


def one_run(
    fleet: Cluster,
    enrolled: list[dict[str, Any]],
    policy: str,
    bucket: float,
    timeout: float,
    processes: int,
    down_s: float,
) -> Run:
    run = Run(policy, len(enrolled))
    n = len(enrolled)
    hosts = Hosts([fleet.device_url(i) for i in range(n)], enrolled, policy, processes)
    urls = [s.url for s in fleet.servers]
    try:
        wait_until(lambda: hosts.connected() == n, 300, "every device to connect", interval=0.5)
        wait_until(lambda: gauges(urls) == n, 60, "the servers to count every socket", 0.25)
        # Sessions as in production: older than STABLE_SESSION_S, so the kill ends stable sessions.
        settled = max(w[-1] for w in hosts.timestamps()[0]) + STABLE_SESSION_S + 0.5
        wait_until(lambda: time.monotonic() >= settled, STABLE_SESSION_S + 5, "the sessions to be stable", 0.25)

        client0 = hosts.cpu_seconds()
        run.killed = time.monotonic()
        for server in fleet.servers:
            server.kill(signal.SIGKILL)
        time.sleep(down_s)  # an outage of this length before the restart (0: restart at once)
        for server in fleet.servers:
            server.launch()
        run.launched = time.monotonic()
        pids = fleet.pids()
        stop = threading.Event()

        def sample_cpu() -> None:
            while not stop.is_set():
                with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
                    run.cpu.append((time.monotonic(), sum(proc_stat(pid)[0] for pid in pids)))
                stop.wait(bucket / 5)

        sampler = threading.Thread(target=sample_cpu, daemon=True)
        sampler.start()
        wait_until(lambda: all(ready(u) for u in urls), 120, "the restarted servers to be ready", interval=0.05)
        run.ready = time.monotonic()
        deadline = run.launched + timeout
        while time.monotonic() < deadline and (run.all_welcomed is None or run.gauge_full is None):
            if run.gauge_full is None and gauges(urls) >= n:
                run.gauge_full = time.monotonic()
            if run.all_welcomed is None and hosts.connected() == n:
                welcomes, _ = hosts.timestamps()
                if all(w and w[-1] > run.launched for w in welcomes):
                    run.all_welcomed = max(min(t for t in w if t > run.launched) for w in welcomes)
            time.sleep(bucket)
        stop.set()
        sampler.join(5)
        run.client_cpu_s = hosts.cpu_seconds() - client0
        welcomes, attempts = hosts.timestamps()
        run.accepts = sorted(t for w in welcomes for t in w if t > run.launched)
        run.attempts = sorted(t for a in attempts for t in a if t > run.killed)
    finally:
        hosts.close()
    return run


def report(
    runs: list[Run], bucket: float, handshakes_per_minute: int, detail_s: float, down_s: float, store: str
) -> None:
    n = runs[0].devices
    print(
        f"\n{n:,} simulated devices on {store}, kill -9, {down_s:g} s down, then restart on"
        " the same store;"
        f"\nserver started with --handshakes-per-minute {handshakes_per_minute:,} (every device dials from"
        f" 127.0.0.1, and the default 120/min per address would throttle the test itself)\n"
    )
    width = max(len(POLICIES[r.policy]) for r in runs) + 2
    header = f"{'':44}" + "".join(f"{POLICIES[r.policy]:>{width}}" for r in runs)
    print(header)

    def row(label: str, values: list[str]) -> None:
        print(f"{label:44}" + "".join(f"{v:>{width}}" for v in values))

    def done(r: Run) -> float:
        return r.all_welcomed or time.monotonic()

    row("restart to /readyz 200 (s)", [f"{r.ready - r.launched:.2f}" for r in runs])
    row(f"restart to all {n:,} welcomed (s)", [r.after(r.all_welcomed) for r in runs])
    row(f"restart to open-sockets gauge = {n:,} (s)", [r.after(r.gauge_full) for r in runs])
    row("/readyz 200 to all welcomed (s)", [f"{done(r) - r.ready:.2f}" for r in runs])
    row("connection attempts, kill to all back", [f"{len(r.attempts):,}" for r in runs])
    row("  per device", [f"{len(r.attempts) / n:.1f}" for r in runs])
    row("peak accept rate (handshakes/s)", [f"{_peak(r, bucket):.0f}" for r in runs])
    row(
        "median accept rate while reconnecting (/s)",
        [f"{_median_rate(r, bucket):.0f}" for r in runs],
    )
    row(
        "server CPU, ready to all back (% of a core)",
        [_pct(r.cpu_percent(r.ready, min(done(r), r.cpu[-1][0] if r.cpu else r.ready))) for r in runs],
    )
    row("server CPU, busiest bucket (% of a core)", [_pct(_peak_cpu(r, bucket)) for r in runs])
    row("server CPU per accepted handshake (ms)", [_per_handshake(r) for r in runs])
    row("device processes' CPU, kill to all back (s)", [f"{r.client_cpu_s:.1f}" for r in runs])

    print(f"\n(open-sockets gauge: the server's {GAUGE} on /metrics)")
    print(f"\naccepted handshakes per second and server CPU, by {bucket:g} s bucket after the restart")
    print(f"(every bucket for the first {detail_s:g} s, then 1 s buckets; '.' = none accepted)\n")
    print(f"{'t (s)':>8}" + "".join(f"{r.policy + ' acc/s':>16}{'cpu%':>7}" for r in runs))
    end = max(done(r) - r.launched for r in runs) + bucket
    t = 0.0
    while t < end:
        step = bucket if t < detail_s else 1.0
        cells = ""
        for r in runs:
            rate = r.rate(r.launched + t, r.launched + t + step)
            cpu = r.cpu_percent(r.launched + t, r.launched + t + step + bucket / 2)
            cells += f"{(f'{rate:.0f}' if rate else '.'):>16}{_pct(cpu):>7}"
        print(f"{t:>8.2f}{cells}")
        t += step


def _peak(r: Run, bucket: float) -> float:
    if not r.accepts:
        return 0.0
    start = r.launched
    rates = []
    while start < r.accepts[-1] + bucket:
        rates.append(r.rate(start, start + bucket))
        start += bucket
    return max(rates)


def _median_rate(r: Run, bucket: float) -> float:
    if not r.accepts:
        return 0.0
    start, rates = r.accepts[0], []
    while start <= r.accepts[-1]:
        rates.append(r.rate(start, start + bucket))
        start += bucket
    return statistics.median(rates)


def _peak_cpu(r: Run, bucket: float) -> float | None:
    """The busiest bucket from /readyz 200 until all were back."""
    end = r.all_welcomed or (r.cpu[-1][0] if r.cpu else r.ready)
    values, start = [], r.ready
    while start < end:
        value = r.cpu_percent(start, start + bucket)
        if value is not None:
            values.append(value)
        start += bucket
    return max(values) if values else None


def _per_handshake(r: Run) -> str:
    """Server CPU from the first accepted handshake to the last, per handshake."""
    if len(r.accepts) < 2:
        return "-"
    first, last = r.accepts[0], min(r.accepts[-1], r.cpu[-1][0] if r.cpu else r.accepts[-1])
    a, b = r._cpu_at(first), r._cpu_at(last)
    inside = sum(1 for t in r.accepts if first <= t <= last)
    return "-" if a is None or b is None or not inside else f"{1000 * (b - a) / inside:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--bucket", type=float, default=0.25, help="seconds per accept-rate bucket")
    parser.add_argument("--policies", default="backoff,old")
    parser.add_argument("--handshakes-per-minute", type=int, default=1_000_000)
    parser.add_argument("--down", type=float, default=0.0, help="seconds the orchestrator stays dead before restarting")
    parser.add_argument("--processes", type=int, default=2, help="processes hosting the simulated devices")
    parser.add_argument("--timeout", type=float, default=180.0, help="give up on a run after this long")
    parser.add_argument("--detail", type=float, default=8.0, help="seconds of the timeline shown per bucket")
    add_store_options(parser)
    args = parser.parse_args()
    check_store_options(parser, args)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    runs = []
    with from_args(args, handshakes_per_minute=str(args.handshakes_per_minute)) as fleet:
        enrolled = asyncio.run(enroll(fleet, args.devices, 0))
        for policy in args.policies.split(","):
            print(f"  {policy}: connecting {args.devices} devices, then kill -9 and restart", file=sys.stderr)
            runs.append(one_run(fleet, enrolled, policy, args.bucket, args.timeout, args.processes, args.down))
    report(runs, args.bucket, args.handshakes_per_minute, args.detail, args.down, describe(args.store, args.replicas))
    figures = [
        {
            "policy": r.policy,
            "ready_s": r.ready - r.launched,
            "all_welcomed_s": None if r.all_welcomed is None else r.all_welcomed - r.launched,
            "gauge_full_s": None if r.gauge_full is None else r.gauge_full - r.launched,
            "attempts": len(r.attempts),
        }
        for r in runs
    ]
    print(json.dumps({"devices": args.devices, "runs": figures, **labels(args)}))


if __name__ == "__main__":
    main()
