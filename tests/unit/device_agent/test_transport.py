"""The agent's WebSocket client: frames written at once keep their order, and backpressure still waits."""

from __future__ import annotations

import asyncio
import contextlib

from websockets.asyncio.server import ServerConnection, serve

from device_agent.transport import Closed, Transport


async def test_frames_written_at_once_arrive_whole_and_in_order_and_a_pushed_back_socket_makes_send_wait() -> None:
    received: list[str] = []
    got_all = asyncio.Event()

    async def collect(ws: ServerConnection) -> None:
        async for message in ws:
            received.append(str(message))
            if len(received) == 201:
                got_all.set()

    async with serve(collect, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with Transport(f"ws://127.0.0.1:{port}", "token", 1 << 20) as t:
            frames = [f'{{"n": {i}, "pad": "{"é" * (i % 7)}"}}' for i in range(200)]
            for frame in frames:
                await t.send(frame)
            conn = t._conn
            assert conn is not None
            conn.pause_writing()  # what the event loop calls when the socket's buffer is full
            late = asyncio.create_task(t.send('{"n": "late"}'))
            for _ in range(20):  # loop turns, not time: only resume_writing can let it go
                await asyncio.sleep(0)
            assert not late.done(), "a send under backpressure must wait until the socket drains"
            conn.resume_writing()
            async with asyncio.timeout(10):
                await late
                await got_all.wait()
    assert received == [*frames, '{"n": "late"}']


async def test_a_send_after_the_peer_closed_raises_closed() -> None:
    async def close_at_once(ws: ServerConnection) -> None:
        await ws.close(4401, "revoked")

    async with serve(close_at_once, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with Transport(f"ws://127.0.0.1:{port}", "token", 1 << 20) as t:
            with contextlib.suppress(Closed):
                await t.recv()  # the close arrives
            try:
                await t.send("{}")
            except Closed as exc:
                assert exc.code == 4401
            else:
                raise AssertionError("a send on a closed connection must raise Closed")
