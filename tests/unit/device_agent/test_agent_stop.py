"""The emergency stop on a real agent process, frame by frame: a control state that says stopped
kills the running command (`device_stopped`), refuses action tools while read-only ones run,
survives a kill -9 of the agent (the ledger keeps it), and only a newer state that says not
stopped (a `device_control` frame or a welcome) lifts it; an older copy arriving late changes
nothing, and the agent reports the generation it applied in its heartbeats."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

from device_agent.agent import STOP_GRACE_S
from device_agent.datadir import LEDGER_NAME
from tests.unit.device_agent.scripted import Connection, scripted

ECHO = {"tool": "system.echo", "arguments": {"text": "still observing"}}
WRITE = {"tool": "files.write", "arguments": {"path": "acted.txt", "content": "x"}}
SLEEP = {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", "touch started; exec sleep 300"], "timeout_s": 600}}


def statuses(frame: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(r["status"], (r.get("error") or {}).get("code")) for r in frame["results"]]


async def wait_for(path: Path, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not await asyncio.to_thread(path.exists):
            await asyncio.sleep(0.05)


async def stopped_agent_refuses(conn: Connection, fence: int, workspace: Path) -> None:
    refused = await conn.result_for(await conn.batch(WRITE, fence=fence))
    assert statuses(refused) == [("skipped", "device_stopped")]
    message = refused["results"][0]["error"]["message"]
    assert "stopped by an operator" in message and "resume" in message
    assert not (workspace / "acted.txt").exists()
    observed = await conn.result_for(await conn.batch(ECHO, fence=fence + 1))
    assert statuses(observed) == [("success", None)]


async def test_a_stop_kills_the_running_command_refuses_actions_and_survives_an_agent_kill(tmp_path: Path) -> None:
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        running = await conn.batch(SLEEP, ECHO, fence=1)
        await wait_for(agent.workspace / "started")
        began = time.monotonic()
        await conn.send("device_control", reliable=True, control=stop(1, "stopped by an operator (key k_1): runaway"))
        ended = await conn.result_for(running)
        assert time.monotonic() - began < STOP_GRACE_S + 8, "the running command outlived the stop"
        assert statuses(ended) == [("failure", "device_stopped"), ("skipped", "device_stopped")]
        assert "runaway" in ended["results"][0]["error"]["message"]
        await stopped_agent_refuses(conn, 2, agent.workspace)

        # kill -9 and a server that does not say: the ledger keeps the stop.
        await asyncio.to_thread(agent.kill)
        ledger = sqlite3.connect(agent.data_dir / LEDGER_NAME)
        try:
            (value,) = ledger.execute("SELECT value FROM meta WHERE key='control'").fetchone()
        finally:
            ledger.close()
        assert "runaway" in value
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        assert conn.hello["control_gen"] == 1
        await stopped_agent_refuses(conn, 4, agent.workspace)

        await conn.send("device_control", reliable=True, control={"gen": 2, "stopped": False, "resumed": 2})
        assert (await conn.recv("heartbeat"))["control_gen"] == 2  # reported at once
        done = await conn.result_for(await conn.batch(WRITE, fence=6))
        assert statuses(done) == [("success", None)]
        assert (agent.workspace / "acted.txt").exists()


async def test_the_welcome_converges_an_agent_that_was_away(tmp_path: Path) -> None:
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome(control=stop(1, "stopped by an operator (key k_2): while you were away"))
        await stopped_agent_refuses(conn, 1, agent.workspace)
        await asyncio.to_thread(agent.stop)

        agent.start()
        conn = await server.next_connection()
        await conn.welcome(control={"gen": 2, "stopped": False, "resumed": 2})  # resumed while it was away
        done = await conn.result_for(await conn.batch(WRITE, fence=3))
        assert statuses(done) == [("success", None)]
        assert "resumed by an operator" in agent.log()


async def test_an_older_control_state_arriving_late_changes_nothing(tmp_path: Path) -> None:
    """Copies are sent again until applied, and may arrive out of order (two replicas, a resend
    after a failover): a state older than the one applied must not lift a stop."""
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        await conn.send("device_control", reliable=True, control=stop(3, "stopped again"))
        assert (await conn.recv("heartbeat"))["control_gen"] == 3
        await conn.send("device_control", reliable=True, control=stop(3, "stopped again"))  # the same, again
        await conn.send("device_control", reliable=True, control={"gen": 2, "stopped": False, "resumed": 2})
        await stopped_agent_refuses(conn, 1, agent.workspace)
        beat = await conn.recv("heartbeat")
        assert beat["control_gen"] == 3
        assert "resumed by an operator" not in agent.log()


def stop(gen: int, reason: str) -> dict[str, Any]:
    return {"gen": gen, "stopped": True, "reason": reason}


async def test_a_stop_and_a_resume_heard_together_still_end_the_running_command(tmp_path: Path) -> None:
    """The stop's frame was lost and the resume's came: the state the agent applies says not
    stopped, but names a stop it never applied, so what ran when the operator stopped it ends."""
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        running = await conn.batch(SLEEP, ECHO, fence=1)
        await wait_for(agent.workspace / "started")
        state = {"gen": 2, "stopped": False, "reason": "", "resumed": 2, "stopped_at": 1}
        await conn.send("device_control", reliable=True, control=state)
        ended = await conn.result_for(running)
        assert statuses(ended)[0] == ("failure", "device_stopped"), ended
        done = await conn.result_for(await conn.batch(WRITE, fence=2))
        assert statuses(done) == [("success", None)]  # and it is not stopped now
