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
from device_agent.orphans import MARK_VAR, ProcStat, Recorder, read_stat
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
