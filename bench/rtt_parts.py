"""Each side of a round trip on its own: the agent against a scripted orchestrator, the server
against a raw WebSocket device, next to the raw echo.

`bench/rtt.py` times the whole system; when it moves, this tells which side moved. The agent is a
real `orrery agent` process driven by a scripted orchestrator (tests/unit/device_agent/scripted.py)
that sends the next `command_batch` (one `system.echo`) as soon as the last `result_batch` is in.
The server is a real `orrery serve` running a chain of nodes on a raw device
(tests/rawdevice.py) that answers every batch at once. Both partners are minimal Python
`websockets` peers, so each figure is that side's work plus about one echo.

With `--store postgres` the server side runs on a throwaway durable Postgres; with `--replicas N`
(and Redis) its raw device connects to a follower, so each frame takes the relay hop to the
leader (bench/stores.py). The agent side has no orchestrator store: it is the same on every store.

    python bench/rtt_parts.py [--batches 1500] [--store sqlite|postgres] [--replicas N]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.echo import echo_rtt, frame_size
from bench.stores import add_store_options, check_store_options, describe, from_args, labels
from tests.rawdevice import RawDevice
from tests.unit.device_agent.scripted import scripted

WARMUP = 50


async def agent_side(batches: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        async with scripted(Path(tmp)) as (server, agent):
            agent.start()
            conn = await server.next_connection()
            await conn.welcome()
            samples = []
            for i in range(batches + WARMUP):
                t0 = time.perf_counter()
                batch_id = await conn.batch({"tool": "system.echo", "arguments": {"text": "x"}}, fence=i + 1)
                while True:
                    frame = json.loads(await conn.ws.recv())
                    if frame["seq"]:
                        conn.ack = max(conn.ack, frame["seq"])
                    if frame["type"] == "result_batch" and frame["batch_id"] == batch_id:
                        break
                if i >= WARMUP:
                    samples.append((time.perf_counter() - t0) * 1000)
            return samples


async def _drive(dev: RawDevice, count: int) -> list[float]:
    assert dev.ws is not None
    samples: list[float] = []
    last = None
    while len(samples) < count:
        frame = json.loads(await dev.ws.recv())
        if frame["seq"]:
            dev.ack = frame["seq"]
        if frame["type"] != "command_batch":
            continue
        now = time.perf_counter()
        if last is not None:
            samples.append((now - last) * 1000)
        last = now
        results = [{"call_id": c["call_id"], "status": "success", "result": "x"} for c in frame["commands"]]
        await dev.send("result_batch", batch_id=frame["batch_id"], fence=frame["fence"], results=results)
    return samples


def server_side(nodes: int, args: argparse.Namespace) -> list[float]:
    with from_args(args, max_nodes_per_task=str(nodes + 10)) as fleet:
        fleet.use(fleet.follower())  # (with one replica, that one)
        dev = RawDevice(fleet, "raw")

        async def run() -> list[float]:
            await dev.connect()
            # Welcomed is not yet known: on a follower the leader records the device (and its
            # tools, which the submission is checked against) a moment later.
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, fleet.wait_device, dev.enrolled["id"], "idle")
            ids = [f"n{i}" for i in range(nodes + 1)]
            pinned = {"device": dev.enrolled["id"]}
            dag = {
                "nodes": [{"id": n, "placement": pinned, "commands": [{"tool": "raw.echo"}]} for n in ids],
                "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
            }
            submitted = asyncio.get_running_loop().run_in_executor(None, fleet.submit, dag)
            samples = await _drive(dev, nodes)
            await submitted
            return samples[WARMUP:]

        return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1500)
    add_store_options(parser)
    args = parser.parse_args()
    check_store_options(parser, args)
    agent = asyncio.run(agent_side(args.batches))
    server = server_side(args.batches + WARMUP, args)
    echo = echo_rtt(frame_size(), 2000)
    base = statistics.median(echo)
    print("\nround trip of each side against a minimal partner; p50 in ms; ratio = p50 / raw echo p50")
    print(f"server side on {describe(args.store, args.replicas, args.redis)}\n")
    for name, samples in (("raw websockets echo", echo), ("agent side", agent), ("server side", server)):
        p50 = statistics.median(samples)
        print(f"{name:24} {len(samples):>6} {p50:>8.3f} {p50 / base:>6.1f}x")
    print(
        json.dumps(
            {
                "agent_p50": statistics.median(agent),
                "server_p50": statistics.median(server),
                "echo_p50": base,
                **labels(args),
            }
        )
    )


if __name__ == "__main__":
    main()
