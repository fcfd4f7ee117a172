"""What a command leaves running when its agent dies: recorded in the ledger, killed by the next
agent before it reports the call, and never a stranger's process (device_agent/orphans.py).

Every process here is real; each test kills what it started, whatever happens."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from device_agent import orphans
from device_agent.ledger import Ledger, ProcessRecord
from device_agent.orphans import MARK_VAR, ProcStat, Recorder, end_orphans, read_stat, sweep
from device_agent.toolset_host import InProcessServer
from device_agent.toolsets.shell import build
from tests.support import ROOT, wait_until
from tests.unit.device_agent.toolkit import make_ctx

pytestmark = pytest.mark.skipif(not orphans.SUPPORTED, reason="process groups are swept through Linux's /proc")

DEVICE = "dev_1"


def running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie does not: it was killed and waits to be reaped)."""
    stat = read_stat(pid)
    return stat is not None and not stat.gone


def stat_of(pid: int) -> ProcStat:
    stat = read_stat(pid)
    assert stat is not None, f"no process {pid}"
    return stat


def start_of(pid: int) -> int:
    return stat_of(pid).start


def record(ledger: Ledger, pid: int, start: int | None = None, batch_id: str = "b1", call_id: str = "c1") -> None:
    start = start_of(pid) if start is None else start
    ledger.record_process(ProcessRecord(pid, start, orphans.boot_id(), batch_id, call_id))


def written(path: Path) -> bool:
    return path.exists() and path.read_text().endswith("\n")


def pids_in(path: Path, n: int) -> list[int]:
    """The `n` pids a script wrote to `path`, one a line, once they are all there (bounded)."""
    lines = wait_until(lambda: path.exists() and len(found := path.read_text().split()) >= n and found, 10, path.name)
    return [int(p) for p in lines]


@contextlib.contextmanager
def reaping(*extra: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started in the block (append them), killed and reaped when it ends, with `extra`
    pids and whatever a test adds to the list's pids."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for pid in extra:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def spawn(argv: list[str], cwd: Path, mark: str | None = None) -> subprocess.Popen[bytes]:
    """A process in a session (and group) of its own, as shell.run starts one; `mark`: its MARK_VAR."""
    env = {k: v for k, v in os.environ.items() if k != MARK_VAR}
    if mark is not None:
        env[MARK_VAR] = mark
    return subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- the sweep at start


def test_the_sweep_kills_a_recorded_group_with_a_child_that_left_it_for_a_session_of_its_own(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    mark = orphans.mark(ledger.identity, "b1", "c1")
    script = "setsid sleep 600 & echo $! >> pids; sleep 600 & echo $! >> pids; wait"
    with reaping() as started:
        started.append(leader := spawn(["sh", "-c", script], tmp_path, mark))
        escaped, child = pids_in(tmp_path / "pids", 2)
        with reaping(escaped, child):
            wait_until(lambda: stat_of(escaped).session == escaped, 10, "the child to leave for a session of its own")
            record(ledger, leader.pid)
            done = sweep(ledger.processes(), ledger.identity)
            assert sorted(p.pid for p in done.killed) == sorted([leader.pid, escaped, child])
            assert done.spared == []
            assert not any(running(p) for p in (leader.pid, escaped, child))  # the sweep waited for them
            assert {(p.batch_id, p.call_id) for p in done.killed} == {("b1", "c1")}


def test_the_sweep_finds_by_its_mark_a_process_started_before_its_group_was_recorded(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    with reaping() as started:
        started.append(ours := spawn(["sleep", "600"], tmp_path, orphans.mark(ledger.identity, "b2", "c3")))
        started.append(theirs := spawn(["sleep", "600"], tmp_path, orphans.mark("0123456789abcdef", "b2", "c3")))
        done = sweep([], ledger.identity)
        assert [(p.pid, p.batch_id, p.call_id) for p in done.killed] == [(ours.pid, "b2", "c3")]
        assert not running(ours.pid)
        assert running(theirs.pid)  # another agent's


def test_a_record_whose_pid_now_belongs_to_an_unrelated_process_kills_nothing(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    with reaping() as started:
        started.append(stranger := spawn(["sleep", "600"], tmp_path))
        # The recorded leader started at another time: the pid was reused by `stranger`.
        record(ledger, stranger.pid, start=start_of(stranger.pid) - 1)
        done = sweep(ledger.processes(), ledger.identity)
        assert (done.killed, done.spared) == ([], [])
        assert running(stranger.pid)


def test_a_leaderless_group_is_killed_only_if_one_of_its_processes_carries_the_mark(tmp_path: Path) -> None:
    """With its leader gone, a group is ours or a stranger's who got the number later: the mark
    on one of its processes tells; without it the group is left alone and reported."""
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    for marked in (False, True):
        pids = tmp_path / f"pids-{marked}"
        mark = orphans.mark(ledger.identity, "b1", "c1") if marked else None
        with reaping() as started:
            started.append(leader := spawn(["sh", "-c", f"sleep 600 & echo $! > {pids.name}"], tmp_path, mark))
            (child,) = pids_in(pids, 1)
            # `$!` is known as soon as sh forks; the fork is named sleep only once it has exec'd
            wait_until(lambda pid=child: stat_of(pid).name == "sleep", 10, "the background child to exec sleep")
            with reaping(child):
                start = start_of(leader.pid)
                assert leader.wait(10) == 0  # the leader is gone (reaped); its child keeps the group
                assert stat_of(child).pgrp == leader.pid
                record(ledger, leader.pid, start)
                done = sweep(ledger.processes(), ledger.identity)
                ledger.clear_processes()
                if marked:
                    assert [p.pid for p in done.killed] == [child] and done.spared == []
                    assert not running(child)
                else:
                    assert done.killed == [] and [p.pid for p, _ in done.spared] == [child]
                    assert running(child)
                    note = done.notes()[("b1", "c1")]
                    assert f"pid {child} (sleep)" in note and "left alone" in note


async def test_the_agent_start_kills_what_the_last_run_left_and_clears_the_records(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    with reaping() as started:
        started.append(leader := spawn(["sleep", "600"], tmp_path))
        record(ledger, leader.pid, batch_id="b9", call_id="c2")
        notes = await end_orphans(ledger)
        assert not running(leader.pid)
        assert ledger.processes() == []
        assert notes == {("b9", "c2"): "the agent killed the 1 process(es) it had left running before reporting this"}


# ---------------------------------------------------------------- recording what shell.run starts


async def test_shell_run_records_its_group_while_it_runs_and_marks_its_environment(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    ctx = make_ctx(tmp_path)
    ctx.processes.watcher = Recorder(ledger, lambda: ("b1", "c7"))
    server = InProcessServer(build(ctx))
    script = f"echo ${MARK_VAR} > mark; echo $$ > pid; exec sleep 600"
    call = asyncio.create_task(server.call("shell", "run", {"argv": ["sh", "-c", script]}, 60))
    try:
        async with asyncio.timeout(10):
            while not ledger.processes() or not written(tmp_path / "pid"):
                await asyncio.sleep(0.02)
        pid = int((tmp_path / "pid").read_text())
        assert ledger.processes() == [ProcessRecord(pid, start_of(pid), orphans.boot_id(), "b1", "c7")]
        assert (tmp_path / "mark").read_text() == f"{ledger.identity}:b1:c7\n"
    finally:
        call.cancel()
        await asyncio.wait({call}, timeout=10)
    assert not running(pid)
    assert len(ledger.processes()) == 1  # reaped: the row goes with the batch's results


# ---------------------------------------------------------------- dying with the agent

AGENT = textwrap.dedent(
    """
    import asyncio, sys
    from device_agent.orphans import preexec

    async def main():
        proc = await asyncio.create_subprocess_exec(
            "sleep", "600", start_new_session=True, preexec_fn=preexec(), stdin=asyncio.subprocess.DEVNULL
        )
        print(proc.pid, flush=True)
        await asyncio.sleep(600)

    if sys.argv[1] == "uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())
    """
)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_program_a_tool_starts_dies_with_the_agent(tmp_path: Path, loop: str) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", AGENT, loop], cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    ) as agent:
        try:
            assert agent.stdout is not None
            child = int(agent.stdout.readline())
            with reaping(child):
                assert stat_of(child).session == child
                agent.kill()  # kill -9
                agent.wait(10)
                wait_until(lambda: not running(child), 10, "the program to die with its agent")
        finally:
            agent.kill()
            agent.wait(10)


async def test_a_restarted_agent_kills_what_its_last_run_left_running_before_it_says_hello(tmp_path: Path) -> None:
    """The agent process itself (not only the sweep): started on a data dir whose ledger recorded a
    command's process group still running, it has killed that group by the time its hello goes
    out, so nothing it then reports (the call `uncertain`) can run on beside a retry or a probe."""
    from device_agent.agent import Agent as AgentLoop  # the loop whose start does it, in process too
    from device_agent.datadir import LEDGER_NAME
    from tests.unit.device_agent.scripted import DEVICE as SCRIPTED_DEVICE
    from tests.unit.device_agent.scripted import scripted

    assert AgentLoop.run is not None
    async with scripted(tmp_path) as (server, agent):
        agent.data_dir.mkdir(parents=True)
        ledger = Ledger(agent.data_dir / LEDGER_NAME, SCRIPTED_DEVICE)
        with reaping() as started:
            started.append(left := spawn(["sleep", "600"], tmp_path))
            record(ledger, left.pid, batch_id="b_old", call_id="c1")
            ledger.close()
            agent.start()
            conn = await server.next_connection()
            await conn.welcome()  # its hello came first
            assert not running(left.pid), "the restarted agent said hello with its last run's command still running"
