"""Many devices on one or more replicas: 1,000, 5,000 and 10,000 simulated devices heartbeating every 10 s.

Each device is a real WebSocket protocol client (hello, then a heartbeat every interval, with a
random phase); the server answers every heartbeat, and the time from sending a heartbeat to that
answer is the heartbeat processing lag. Reported per step: server RSS, server CPU (share of one
core over the measuring window), and lag p50/p99. Once connected, this process freezes its own
heap (`gc.freeze`), so its garbage collections (up to a second at 10,000 connections) do not show
up as server lag.

With `--store postgres` the orchestrator runs on a throwaway durable Postgres, with
`--replicas N` as N replicas (and Redis), the devices spread over them in turn (bench/stores.py);
RSS and CPU are then reported per replica. The last line is the figures as JSON.

    python bench/devices.py [--steps 1000,5000,10000] [--interval 10] [--window 30]
                            [--store sqlite|postgres] [--replicas N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from websockets.asyncio.client import connect

from bench.stores import Cluster, add_store_options, check_store_options, describe, from_args, labels
from protocol.codec import encode
from protocol.messages import Heartbeat, Hello, ToolSpec

TOOLS = [ToolSpec(name="sim.noop", namespace="sim", input_schema={"type": "object"})]


class Device:
    def __init__(self, url: str, device_id: str, token: str, interval: float, lags: list[float]) -> None:
        self.url, self.device_id, self.token, self.interval, self.lags = url, device_id, token, interval, lags
        self.ready = asyncio.Event()

    async def run(self) -> None:
        async with connect(
            self.url,
            additional_headers={"Authorization": f"Bearer {self.token}"},
            max_size=None,
            compression=None,
            ping_interval=None,
            open_timeout=120,
        ) as ws:
            await ws.send(
                encode(Hello(device_id=self.device_id, versions=[1], tools=TOOLS, info={"platform": "linux"}))
            )  # type: ignore[arg-type]
            await ws.recv()  # welcome
            self.ready.set()
            await asyncio.sleep(random.uniform(0, self.interval))  # spread the heartbeats out
            while True:
                sent = time.perf_counter()
                await ws.send(encode(Heartbeat(state="idle")))
                while True:
                    frame = json.loads(await ws.recv())
                    if frame["type"] == "heartbeat":
                        break
                self.lags.append((time.perf_counter() - sent) * 1000)
                await asyncio.sleep(self.interval - (time.perf_counter() - sent))


def proc_stat(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = (
        next(
            int(line.split()[1])
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        / 1024
    )
    return cpu, rss


async def enroll(fleet: Cluster, count: int, start: int) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {fleet.server.api_key}"}
    sem = asyncio.Semaphore(32)
    async with httpx.AsyncClient(base_url=fleet.server.url, headers=headers, timeout=60) as c:

        async def one(i: int) -> dict[str, Any]:
            async with sem:
                r = await c.post("/v1/devices", json={"name": f"d{i:05d}"})
                body: dict[str, Any] = r.json()
                return body

        return list(await asyncio.gather(*(one(i) for i in range(start, start + count))))


async def run(args: argparse.Namespace) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    steps = [int(s) for s in args.steps.split(",")]
    rows = []
    with from_args(
        args,
        heartbeat_interval_s=str(args.interval),
        heartbeat_timeout_s=str(args.interval * 5),
        handshakes_per_minute="1000000",
    ) as fleet:
        pids = fleet.pids()
        lags: list[float] = []
        tasks: list[asyncio.Task[None]] = []
        have = 0
        for target in steps:
            enrolled = await enroll(fleet, target - have, have)
            devices = [
                Device(_ws_url(fleet.device_url(have + k)), e["id"], e["token"], args.interval, lags)
                for k, e in enumerate(enrolled)
            ]
            sem = asyncio.Semaphore(64)

            async def start(d: Device, sem: asyncio.Semaphore = sem) -> None:
                async with sem:
                    tasks.append(asyncio.create_task(d.run()))
                    await asyncio.wait_for(d.ready.wait(), 300)

            await asyncio.gather(*(start(d) for d in devices))
            have = target
            # The load generator's own heap (10,000 client connections) is long-lived: frozen, its
            # garbage collections no longer pause this process for up to a second inside the
            # window, which the lags measured here would blame on the server.
            gc.collect()
            gc.freeze()
            await asyncio.sleep(args.interval)  # let the new devices' first heartbeats settle
            lags.clear()
            cpu0 = [proc_stat(pid)[0] for pid in pids]
            t0 = time.perf_counter()
            await asyncio.sleep(args.window)
            after = [proc_stat(pid) for pid in pids]
            window = time.perf_counter() - t0
            ordered = sorted(lags)
            if not ordered:
                raise SystemExit(f"no heartbeat answered in the {args.window:g} s window: make --window longer")
            rows.append(
                {
                    "devices": target,
                    "rss_mb": [rss for _, rss in after],
                    "cpu_percent": [(c1 - c0) / window * 100 for (c1, _), c0 in zip(after, cpu0, strict=True)],
                    "lag_p50_ms": statistics.median(ordered),
                    "lag_p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
                    "beats": len(ordered),
                }
            )
            print(f"  {target} devices measured", file=sys.stderr)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(
        f"\nsimulated devices on {describe(args.store, args.replicas, args.redis)}, "
        f"heartbeat every {args.interval:g}s, window {args.window:g}s\n"
    )
    print(
        f"{'devices':>8} {'replica':>8} {'RSS MB':>8} {'CPU %':>7} {'lag p50 ms':>11} {'lag p99 ms':>11} {'beats':>7}"
    )
    for row in rows:
        for i, (rss, cpu) in enumerate(zip(row["rss_mb"], row["cpu_percent"], strict=True)):
            lag = f"{row['lag_p50_ms']:>11.2f} {row['lag_p99_ms']:>11.2f} {row['beats']:>7}" if i == 0 else ""
            print(f"{row['devices']:>8} {i:>8} {rss:>8.0f} {cpu:>7.1f} {lag}")
    print(json.dumps({"steps": rows, **labels(args)}))


def _ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/v1/agent"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1000,5000,10000")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=30.0)
    add_store_options(parser)
    args = parser.parse_args()
    check_store_options(parser, args)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
