"""A real agent process against a scripted orchestrator: fences, stale batches, deadlines, the data-dir lock."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import ROOT, child_env
from tests.unit.device_agent.scripted import TOKEN, scripted

ECHO = {"tool": "system.echo", "arguments": {"text": "hi"}}


async def test_hello_carries_the_fence_high_water_mark_of_the_last_server_for_this_device(tmp_path: Path) -> None:
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        first = await server.next_connection()
        await first.welcome(server_id="srv-1")
        assert first.hello["fence_seen"] == 0
        done = await first.result_for(await first.batch(ECHO, fence=7))
        assert done["results"][0]["status"] == "success"

        await asyncio.to_thread(agent.stop)
        agent.start()
        second = await server.next_connection()
        await second.welcome(server_id="srv-2")  # another store: its own fence history
        assert second.hello["fence_seen"] == 7
        done = await second.result_for(await second.batch(ECHO, fence=1))
        assert done["results"][0]["status"] == "success"

        await asyncio.to_thread(agent.stop)
        agent.start()
        third = await server.next_connection()
        await third.welcome(server_id="srv-2")
        assert third.hello["fence_seen"] == 1  # the mark of the server it was last welcomed by


async def test_a_second_agent_on_the_same_data_dir_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        second = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "device_agent", "--server", server.url, "--token", TOKEN],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(ORRERY_AGENT_DATA_DIR=str(agent.data_dir)),
            cwd=ROOT,
        )
        assert second.returncode != 0
        lines = [line for line in (second.stdout + second.stderr).splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert str(agent.data_dir.resolve()) in lines[0]
        assert agent.proc is not None and f"pid {agent.proc.pid}" in lines[0]
        # The holder is untouched: it still runs batches.
        done = await conn.result_for(await conn.batch(ECHO, fence=1))
        assert done["results"][0]["status"] == "success"


def touch(name: str) -> dict[str, Any]:
    return {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", f"echo ran >> {name}"]}}


def ledger_rows(data_dir: Path, batch_id: str) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{data_dir / 'ledger.sqlite3'}?mode=ro", uri=True)) as db:
        return int(db.execute("SELECT count(*) FROM batches WHERE batch_id=?", (batch_id,)).fetchone()[0])


async def test_a_stale_batch_is_answered_with_skipped_results_and_the_mark_and_never_runs(tmp_path: Path) -> None:
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        await conn.result_for(await conn.batch(ECHO, fence=5))
        stale = await conn.batch(touch("stale.txt"), ECHO, fence=3)
        for attempt in ("first delivery", "redelivery"):
            refused = await conn.result_for(stale)
            assert (refused["fence"], refused["fence_seen"]) == (3, 5), attempt
            assert [r["status"] for r in refused["results"]] == ["skipped", "skipped"], attempt
            assert {r["error"]["code"] for r in refused["results"]} == {"stale_fence"}
            message = refused["results"][0]["error"]["message"]
            assert "fence 3" in message and "fence 5" in message and "none of its commands ran" in message
            if attempt == "first delivery":
                await conn.batch(touch("stale.txt"), ECHO, fence=3, batch_id=stale)
        assert not (agent.workspace / "stale.txt").exists()
        assert ledger_rows(agent.data_dir, stale) == 0  # nothing recorded for a refused batch
        done = await conn.result_for(await conn.batch(touch("fresh.txt"), fence=6))
        assert done["results"][0]["status"] == "success"
        assert (agent.workspace / "fresh.txt").read_text() == "ran\n"


async def test_a_batch_whose_deadline_has_passed_is_reported_timeout_and_never_started(tmp_path: Path) -> None:
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        late = await conn.result_for(await conn.batch(touch("late.txt"), ECHO, fence=1, deadline_in_s=-1))
        assert [(r["status"], r["error"]["code"]) for r in late["results"]] == [("skipped", "timeout")] * 2
        assert "deadline" in late["results"][0]["error"]["message"]
        assert not (agent.workspace / "late.txt").exists()


async def test_deadlines_are_judged_by_the_servers_clock_not_a_drifted_device_clock(tmp_path: Path) -> None:
    """The device's clock is ten minutes ahead of the orchestrator's: a batch due in a minute by
    the server's clock must run, with its minute, not be turned away as long past."""
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome(clock_s=-600)
        done = await conn.result_for(await conn.batch(touch("ran.txt"), fence=1, deadline_in_s=60))
        assert [r["status"] for r in done["results"]] == ["success"]
        assert (agent.workspace / "ran.txt").exists()


async def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` without blocking the scripted server's loop; fail naming `what` after `timeout`."""
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None


async def test_unstarted_batches_left_by_a_crash_are_reported_when_due_and_run_when_redelivered(
    tmp_path: Path,
) -> None:
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        long = await conn.batch(
            {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", "echo $$ > pid; exec sleep 30"]}}, fence=1
        )
        soon = await conn.batch(touch("soon.txt"), fence=2, deadline_in_s=3)
        later = await conn.batch(touch("later.txt"), fence=3, deadline_in_s=300)
        pid = agent.workspace / "pid"
        await until(lambda: pid.exists() and bool(pid.read_text().strip()), 30, "the long command to start")
        for _ in range(3):
            await conn.recv("batch_accepted")  # all three are in the ledger before the crash
        await asyncio.to_thread(agent.kill)
        os.kill(int(pid.read_text()), signal.SIGKILL)
        deadline = time.time() + 3.5
        await until(lambda: time.time() > deadline, 10, "the second batch's deadline to pass")

        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        crashed = await conn.result_for(long)
        assert crashed["results"][0]["status"] == "uncertain"
        expired = await conn.result_for(soon)
        assert [(r["status"], r["error"]["code"]) for r in expired["results"]] == [("skipped", "timeout")]
        assert not (agent.workspace / "soon.txt").exists()

        await conn.batch(touch("later.txt"), fence=3, deadline_in_s=300, batch_id=later)  # the server redelivers
        ran = await conn.result_for(later)
        assert ran["results"][0]["status"] == "success"
        assert (agent.workspace / "later.txt").read_text() == "ran\n"


async def test_hello_reports_the_device_policy_as_the_contract_says(tmp_path: Path) -> None:
    env = {
        "ORRERY_AGENT_SHELL_DENY": '["rm", "shutdown"]',
        "ORRERY_AGENT_APPROVAL_REQUIRED": '["gui.click"]',
        "ORRERY_AGENT_KILL_SWITCH": "1",
    }
    async with scripted(tmp_path, **env) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        assert conn.hello["info"]["policy"] == {
            "shell_allow": None,
            "shell_deny": ["rm", "shutdown"],
            "approval_required": ["gui.click"],
            "unattended": False,
            "approvals_local_only": False,
            "kill_switch": True,
            "sandbox": {"kind": "none"},
            "safety_budgets": {"max_destructive_per_minute": 0, "max_consecutive_bad_outcomes": 0},
        }


def sleep_for(seconds: float, timeout_s: float) -> dict[str, Any]:
    return {"tool": "shell.run", "arguments": {"argv": ["sleep", str(seconds)]}, "timeout_s": timeout_s}


async def test_the_commands_timeout_s_is_the_limit_the_shell_runs_under(tmp_path: Path) -> None:
    """Before, shell.run fell back to its own 60-s default whatever the command said."""
    async with scripted(tmp_path) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        started = time.monotonic()
        done = await conn.result_for(await conn.batch(sleep_for(5, 1.5), fence=1))
        took = time.monotonic() - started
        result = done["results"][0]
        assert result["error"]["code"] == "timeout", result
        assert "the command's timeout_s (1.5 s)" in result["error"]["message"]
        assert 1.4 <= took < 4.0, took

        # A batch deadline nearer than the command's limit is the one that stops it, and says so.
        done = await conn.result_for(await conn.batch(sleep_for(5, 30), fence=2, deadline_in_s=1.5))
        result = done["results"][0]
        assert result["error"]["code"] == "timeout", result
        assert "the batch deadline" in result["error"]["message"]


async def test_a_local_only_agent_ignores_an_approval_from_the_orchestrator(tmp_path: Path) -> None:
    """With approvals_local_only, only the owner at the device approves: an `approved` decision
    from the orchestrator (a compromised or misconfigured one) is ignored; an expiry is not."""
    env = {"ORRERY_AGENT_APPROVAL_REQUIRED": '["shell.run"]', "ORRERY_AGENT_APPROVALS_LOCAL_ONLY": "true"}
    async with scripted(tmp_path, **env) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        batch = await conn.batch(touch("forced.txt"), fence=1)
        asked = await conn.recv("approval_request")
        assert asked["local_only"] is True and asked["batch_id"] == batch
        await conn.send("approval_decision", reliable=True, approval_id=asked["approval_id"], decision="approved")
        await conn.send("approval_decision", reliable=True, approval_id=asked["approval_id"], decision="expired")
        result = await conn.result_for(batch)
        assert [(r["status"], r["error"]["code"]) for r in result["results"]] == [("failure", "approval_timeout")]
        assert not (agent.workspace / "forced.txt").exists()


async def test_an_approval_waits_across_an_agent_restart_and_is_asked_again(tmp_path: Path) -> None:
    env = {"ORRERY_AGENT_APPROVAL_REQUIRED": '["shell.run"]'}
    async with scripted(tmp_path, **env) as (server, agent):
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        batch = await conn.batch(touch("later.txt"), fence=1)
        first = await conn.recv("approval_request")
        agent.kill()
        agent.start()
        conn = await server.next_connection()
        await conn.welcome()
        again = await conn.recv("approval_request")  # from the ledger, before any batch arrives
        assert again["approval_id"] == first["approval_id"]
        await conn.batch(touch("later.txt"), fence=1, batch_id=batch)  # the server redelivers
        await conn.send("approval_decision", reliable=True, approval_id=first["approval_id"], decision="approved")
        result = await conn.result_for(batch)
        assert result["results"][0]["status"] == "success"
        assert (agent.workspace / "later.txt").read_text() == "ran\n"
