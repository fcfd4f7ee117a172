"""Viewers polling a rare schedule while someone lists the devices: `GET /v1/devices` latency.

A real server (SQLite, one replica) holds one schedule whose cron is rare: `0 0 30 2 SUN#5` (the
5th Sunday of February, which comes every 28 years; a new schedule that rare is refused, so the
row is written as one stored before that rule). N viewers poll `GET /v1/schedules/rare?next=50`
every `--every` seconds (a dashboard's pace; 0: as fast as they get answers); one probe lists
the devices every 50 ms for the window. Reported per N: the probe's median and p95 latency, and
how many schedule answers the viewers got.

    python bench/schedule_viewers.py [--viewers 0,8] [--every 0.5] [--window 10]

One run on a shared 2-core machine (`--viewers 0,8,16`), median / p95 ms of GET /v1/devices:
before (cron arithmetic on the event loop, every tick walked again per request): 12.7 / 42,
962 / 3548, 1701 / 3614; after (on a worker thread, ticks remembered): 6.9 / 18, 6.6 / 22, 7.8 / 52.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.stores import check_refused, refuse_store
from tests.support import Fleet

RARE = "0 0 30 2 SUN#5"
TASK = {"dag": {"nodes": [{"id": "a", "commands": [{"tool": "shell.run", "arguments": {"argv": ["true"]}}]}]}}


def make_rare_schedule(fleet: Fleet) -> None:
    with fleet.server.client() as c:
        r = c.post("/v1/schedules", json={"name": "rare", "cron": "0 2 * * *", "paused": True, "task": TASK})
        assert r.status_code == 201, r.text
    db = sqlite3.connect(fleet.server.data_dir / "orrery.db")
    with db:
        db.execute("UPDATE schedules SET cron = ?, paused = 0 WHERE name = 'rare'", (RARE,))
    db.close()
    with fleet.server.client() as c:
        shown = c.get("/v1/schedules/rare", params={"next": 50}).json()
        assert shown["cron"] == RARE and len(shown["next_runs"]) > 1, shown


async def measure(url: str, key: str, viewers: int, every: float, window: float) -> tuple[list[float], int]:
    headers = {"Authorization": f"Bearer {key}"}
    stop = asyncio.Event()
    answered = 0

    async def viewer(c: httpx.AsyncClient) -> None:
        nonlocal answered
        while not stop.is_set():
            sent = time.perf_counter()
            r = await c.get("/v1/schedules/rare", params={"next": 50})
            assert r.status_code == 200, r.text
            answered += 1
            await asyncio.sleep(max(0.0, every - (time.perf_counter() - sent)))

    lags: list[float] = []
    limits = httpx.Limits(max_connections=viewers + 2)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as c:
        tasks = [asyncio.create_task(viewer(c)) for _ in range(viewers)]
        end = time.perf_counter() + window
        while time.perf_counter() < end:
            sent = time.perf_counter()
            r = await c.get("/v1/devices")
            assert r.status_code == 200, r.text
            lags.append((time.perf_counter() - sent) * 1000)
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*tasks)
    return lags, answered


WHY_NO_STORE = "it writes its rare schedule straight into the server's SQLite file"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", default="0,8", help="comma-separated viewer counts")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between a viewer's polls")
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured per count")
    refuse_store(parser, WHY_NO_STORE)
    args = parser.parse_args()
    check_refused(parser, args, WHY_NO_STORE)
    with tempfile.TemporaryDirectory() as tmp, Fleet(Path(tmp)) as fleet:
        for i in range(20):
            fleet.enroll(f"dev-{i}")
        make_rare_schedule(fleet)
        print(
            f"GET /v1/devices while N viewers poll GET /v1/schedules/rare?next=50 ({RARE}) every {args.every:g} s, "
            f"{args.window:g} s each"
        )
        print(f"{'viewers':>8} {'median ms':>10} {'p95 ms':>8} {'probes':>7} {'schedule answers':>17}")
        for n in [int(v) for v in args.viewers.split(",")]:
            lags, answered = asyncio.run(measure(fleet.server.url, fleet.server.api_key, n, args.every, args.window))
            p95 = statistics.quantiles(lags, n=20)[-1] if len(lags) > 1 else lags[0]
            print(f"{n:>8} {statistics.median(lags):>10.1f} {p95:>8.1f} {len(lags):>7} {answered:>17}")


if __name__ == "__main__":
    main()
