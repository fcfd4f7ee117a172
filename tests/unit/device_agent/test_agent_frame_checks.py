"""The agent refuses what SPEC section 4 refuses, with the same close codes as the server: a binary
frame (4400), a frame in an unknown protocol version (4426), a frame over its limit at any size
(4413), each after an `error` frame that says why. A real agent process, a scripted orchestrator."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed

from tests.unit.device_agent.scripted import Connection, scripted

LIMIT = 65536


async def closed_by_agent(conn: Connection) -> tuple[list[dict[str, object]], int | None, str]:
    """Frames the agent sent until it closed, and the close code and reason it sent."""
    frames = []
    try:
        async with asyncio.timeout(20):
            while True:
                frames.append(json.loads(await conn.ws.recv()))
    except ConnectionClosed as exc:
        return frames, exc.rcvd.code if exc.rcvd else None, exc.rcvd.reason if exc.rcvd else ""


def heartbeat(**fields: object) -> str:
    return json.dumps({"v": 1, "type": "heartbeat", "seq": 0, "ack": 0, "state": "idle", **fields})


@pytest.mark.parametrize(
    ("frame", "code", "error"),
    [
        (heartbeat().encode(), 4400, "malformed_frame"),
        (heartbeat(v=99), 4426, "no_common_version"),
        (heartbeat(pad="x" * int(LIMIT * 1.5)), 4413, "frame_too_large"),
        (heartbeat(pad="x" * LIMIT * 3), 4413, "frame_too_large"),
    ],
    ids=["binary", "v99", "1.5x limit", "3x limit"],
)
async def test_the_agent_refuses_a_bad_server_frame_with_the_spec_close_code(
    tmp_path: Path, frame: str | bytes, code: int, error: str
) -> None:
    async with scripted(tmp_path, ORRERY_AGENT_MAX_FRAME_BYTES=str(LIMIT)) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        await conn.ws.send(frame)
        frames, closed, reason = await closed_by_agent(conn)
        assert (closed, reason) == (code, error)
        assert [f["code"] for f in frames if f["type"] == "error"] == [error]
        again = await server.next_connection()  # and the agent comes back for a fresh session
        await again.welcome()
