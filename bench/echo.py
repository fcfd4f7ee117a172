"""The raw WebSocket echo every round-trip benchmark is measured against, in the same run: a frame
of the real `command_batch`'s size sent to a `websockets` echo server in another process, and
back."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from protocol.codec import encode
from protocol.messages import Command, CommandBatch
from tests.support import free_port

ECHO_SERVER = """
import asyncio, sys
from websockets.asyncio.server import serve
async def echo(ws):
    async for message in ws:
        await ws.send(message)
async def main():
    async with serve(echo, "127.0.0.1", int(sys.argv[1]), compression=None):
        print("ready", flush=True)
        await asyncio.Future()
asyncio.run(main())
"""


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def frame_size() -> int:
    frame = CommandBatch(
        seq=12,
        ack=11,
        batch_id="b_0123456789abcdef0123",
        task_id="task_0123456789abcdef0123",
        node_id="n123",
        attempt=1,
        fence=123,
        commands=[
            Command(
                call_id="c1", tool="system.echo", tool_type="data_collection", arguments={"text": "x"}, timeout_s=60
            )
        ],
    )
    return len(encode(frame))


async def _echo_rtt(port: int, size: int, n: int) -> list[float]:
    from websockets.asyncio.client import connect

    payload = "x" * size
    samples = []
    async with connect(f"ws://127.0.0.1:{port}", compression=None) as ws:
        for i in range(n + 50):
            t0 = time.perf_counter()
            await ws.send(payload)
            await ws.recv()
            if i >= 50:
                samples.append((time.perf_counter() - t0) * 1000)
    return samples


def echo_rtt(size: int, n: int) -> list[float]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return asyncio.run(_echo_rtt(port, size, n))
    finally:
        proc.terminate()
        proc.wait()
