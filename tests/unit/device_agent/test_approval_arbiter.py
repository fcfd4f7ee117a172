"""The device's ledger is the one arbiter of an approval, on a real agent process, frame by frame:
the first decision recorded there holds whoever made it (the owner at the device, or a request
from the orchestrator); the agent reports the one that holds and reports it again on every new
session until the server acknowledges it; a cancel ends the wait at once and nothing of the
batch runs after it; and a decision given after the batch's deadline still gives the command its
whole timeout."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from device_agent.datadir import LEDGER_NAME
from tests.support import ROOT, child_env
from tests.unit.device_agent.scripted import AgentProcess, Connection, scripted

APPROVE_SHELL = {"ORRERY_AGENT_APPROVAL_REQUIRED": '["shell.run"]'}


def write(name: str, then: str = "") -> dict[str, Any]:
    return {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", f"{then}echo ran >> {name}"]}, "timeout_s": 30}


async def owner(agent: AgentProcess, verb: str, approval_id: str) -> None:
    """`orrery agent approve|deny ID` at the device, as its owner types it."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "device_agent", verb, approval_id, "--data-dir", str(agent.data_dir)],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def acknowledged(agent: AgentProcess, approval_id: str) -> bool:
    """Whether the agent's ledger holds the approval's decision as acknowledged by the server."""
    with contextlib.closing(sqlite3.connect(f"file:{agent.data_dir / LEDGER_NAME}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT reported FROM approvals WHERE approval_id=?", (approval_id,)).fetchone()
    return bool(row and row[0])


async def report(conn: Connection, approval_id: str) -> dict[str, Any]:
    """The next decision the agent reports for `approval_id`."""
    while True:
        frame = await conn.recv("approval_decision")
        if frame["approval_id"] == approval_id:
            return frame


async def test_the_agent_reports_the_decision_that_holds_until_the_server_acknowledges_it(tmp_path: Path) -> None:
    async with scripted(tmp_path, **APPROVE_SHELL) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        batch = await conn.batch(write("a.txt"), fence=1)
        asked = await conn.recv("approval_request")
        await conn.send("approval_decision", reliable=True, approval_id=asked["approval_id"], decision="approved")
        first = await report(conn, asked["approval_id"])
        assert (first["decision"], first["by"]) == ("approved", "orchestrator")
        await conn.ws.close()  # gone before acknowledging it: the report must come again

        conn = await server.next_connection()
        await conn.welcome()  # a new session: the report and the batch's results come again
        seen: dict[str, dict[str, Any]] = {}
        async with asyncio.timeout(30):
            while len(seen) < 2:
                frame = await conn.recv_any()
                if frame["type"] in ("approval_decision", "result_batch"):
                    seen[frame["type"]] = frame
        assert seen["approval_decision"]["decision"] == "approved"
        assert seen["result_batch"]["batch_id"] == batch
        assert seen["result_batch"]["results"][0]["status"] == "success"
        await conn.send("heartbeat", state="idle")  # its ack covers both
        async with asyncio.timeout(10):
            while not await asyncio.to_thread(acknowledged, agent, asked["approval_id"]):
                await asyncio.sleep(0.05)
        await asyncio.to_thread(agent.stop)

        agent.start()  # acknowledged: a restarted agent has nothing more to report
        conn = await server.next_connection()
        await conn.welcome()
        await conn.recv("heartbeat", timeout=30)
        await conn.send("heartbeat", state="idle")
        reported: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(1.5):
                reported.append(await conn.recv("approval_decision"))
        except TimeoutError:
            pass
        assert reported == []


async def test_the_owners_approval_at_the_device_holds_over_the_orchestrators_denial(tmp_path: Path) -> None:
    """Two deciders: the owner approves at the device, then the orchestrator asks to deny. The
    ledger took the owner's first; the agent runs the command and reports `approved`, so the
    orchestrator records what the device did."""
    async with scripted(tmp_path, **APPROVE_SHELL) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        batch = await conn.batch(write("owner.txt"), fence=1)
        asked = await conn.recv("approval_request")
        await owner(agent, "approve", asked["approval_id"])
        await conn.send("approval_decision", reliable=True, approval_id=asked["approval_id"], decision="denied")
        held = await report(conn, asked["approval_id"])
        assert held["decision"] == "approved" and "device owner" in held["by"]
        result = await conn.result_for(batch)
        assert result["results"][0]["status"] == "success"
        assert (agent.workspace / "owner.txt").read_text() == "ran\n"


async def test_a_cancel_ends_the_wait_at_once_and_a_late_approval_runs_nothing(tmp_path: Path) -> None:
    async with scripted(tmp_path, **APPROVE_SHELL) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        batch = await conn.batch(write("late.txt"), write("after.txt"), fence=1)
        asked = await conn.recv("approval_request")
        began = time.monotonic()
        await conn.send("cancel", reliable=True, batch_id=batch, reason="cancelled")
        await asyncio.sleep(0.05)  # the operator approves 50 ms after the cancel
        await conn.send("approval_decision", reliable=True, approval_id=asked["approval_id"], decision="approved")
        held = await report(conn, asked["approval_id"])
        assert held["decision"] == "cancelled"
        result = await conn.result_for(batch)
        assert time.monotonic() - began < 5, "the wait outlived the cancel"
        codes = [(r["status"], (r.get("error") or {}).get("code")) for r in result["results"]]
        assert codes[0][1] == "cancelled" and codes[1][0] == "skipped", codes
        assert not (agent.workspace / "late.txt").exists() and not (agent.workspace / "after.txt").exists()


async def test_an_approval_at_the_device_after_the_deadline_gives_the_command_its_whole_timeout(
    tmp_path: Path,
) -> None:
    """The wait for a person does not count: a command approved at the device after its batch's
    deadline passed still has the time it had left when it began to wait (before, it was killed
    within 0.1 s), and the agent reports the deadline it moved so the server keeps the same one."""
    async with scripted(tmp_path, **APPROVE_SHELL) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        batch = await conn.batch(write("slow.txt", then="sleep 0.8; "), fence=1, deadline_in_s=2.0)
        asked = await conn.recv("approval_request")
        deadline = conn.now().timestamp() + 2.0
        while conn.now().timestamp() < deadline + 0.5:  # the batch's deadline passes while it waits
            await conn.send("heartbeat", state="idle")
            await asyncio.sleep(0.1)
        await owner(agent, "approve", asked["approval_id"])
        held = await report(conn, asked["approval_id"])
        from datetime import datetime

        assert datetime.fromisoformat(held["deadline"]).timestamp() > deadline + 0.5
        result = await conn.result_for(batch)
        assert result["results"][0]["status"] == "success", result["results"]
        assert (agent.workspace / "slow.txt").read_text() == "ran\n"
