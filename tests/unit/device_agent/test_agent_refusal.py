"""A refused token ends the agent after a few tries; a transient failure is retried forever.

A real agent process against the scripted orchestrator, which closes each connection with the
code under test right after the hello (the real server's refusals over HTTP 401 are tested in
tests/integration/test_agent_reliability.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.device_agent.scripted import DEVICE, scripted

REFUSED = "the orchestrator refused this device's token: revoked or wrong; enroll again or pass the right --token"


async def test_three_4403_closes_in_a_row_end_the_agent_with_status_3_and_one_clear_line(tmp_path: Path) -> None:
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        for _ in range(3):
            conn = await server.next_connection()
            await conn.recv("hello")
            await conn.ws.close(4403, "device id mismatch")
        assert await agent.exited(timeout=20) == 3
        log = agent.log()
        errors = [line for line in log.splitlines() if " ERROR " in line]
        assert len(errors) == 1 and REFUSED in errors[0] and DEVICE in errors[0], log
        assert "Traceback" not in log and "{" not in log, log
        assert len(re.findall(r"refused this device's token \(closed with 4403", log)) == 2, log


async def test_a_welcomed_session_forgets_earlier_refusals(tmp_path: Path) -> None:
    """Two refusals, a session that works, two more: the agent is still there."""
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        for step in ["refuse", "refuse", "welcome", "refuse", "refuse"]:
            conn = await server.next_connection()
            if step == "welcome":
                await conn.welcome()
                await conn.recv("heartbeat")
                await conn.ws.close(1001, "going away")  # a short session: the backoff is not reset
            else:
                await conn.recv("hello")
                await conn.ws.close(4401, "device token revoked")
        await server.next_connection()  # it tries again rather than giving up
        assert agent.proc is not None and agent.proc.poll() is None


async def test_a_server_that_keeps_answering_1013_is_retried_past_the_refusal_limit(tmp_path: Path) -> None:
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        for _ in range(5):
            conn = await server.next_connection()
            await conn.recv("hello")
            await conn.ws.close(1013, "the orchestrator is busy; reconnect")
        await server.next_connection()
        assert agent.proc is not None and agent.proc.poll() is None
        assert "refused this device's token" not in agent.log()
