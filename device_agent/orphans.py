"""Processes a command leaves running when its agent dies, and how the next agent ends them.

`shell.run` starts each program in a session of its own, so that a timeout or a cancel kills
everything it started with one group kill. The same separation means that a `kill -9` of the
agent kills none of it. Left alone, the command would run on, unseen, while the restarted agent
reports its call `uncertain`, the orchestrator probes the device (`verify`) and judges it, and a
retry of the node runs next to it: two executions of one node at once, and a probe judging a
device while the node's command still runs. Three things prevent that (SPEC section 4: a batch
runs at most once; section 5), of which these are the first two:

1. The program a tool starts gets the parent-death signal (`PR_SET_PDEATHSIG`, SIGKILL,
   `preexec`): the kernel kills it when the agent dies. Only it: its children are re-parented
   and live on, hence 2.
2. Every process group a command starts is in the ledger as soon as its start returns
   (`Recorder.spawned`, one small write), with its leader's identity: start time and boot id.
   Every child's environment carries `ORRERY_AGENT_RUN=<ledger id>:<batch>:<call>` (`mark`),
   which its own children inherit, also those started before the row was written and those
   that left the group (setsid).

Linux only: elsewhere nothing is recorded.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from device_agent.ledger import Ledger, ProcessRecord

log = logging.getLogger("orrery.agent")

MARK_VAR = "ORRERY_AGENT_RUN"
_PROC = Path("/proc")
_BOOT_ID = _PROC / "sys/kernel/random/boot_id"
SUPPORTED = sys.platform.startswith("linux")


# ---------------------------------------------------------------- 1. dying with the agent


def _load_prctl() -> Callable[..., int] | None:
    if not SUPPORTED:
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_prctl = _load_prctl()
# Built before any fork: the child only calls the C function with them.
_PR_SET_PDEATHSIG = ctypes.c_int(1)
_SIGKILL = ctypes.c_ulong(signal.SIGKILL)
_ZERO = ctypes.c_ulong(0)


def _die_with(parent: int) -> None:
    # Runs in the child between fork and exec, possibly while another thread of the agent held
    # a lock: nothing here takes one (a C call and two system calls on prebuilt arguments).
    assert _prctl is not None
    _prctl(_PR_SET_PDEATHSIG, _SIGKILL, _ZERO, _ZERO, _ZERO)
    if os.getppid() != parent:  # the agent died before the signal was armed: as if it came
        os.kill(os.getpid(), signal.SIGKILL)


def preexec() -> Callable[[], None] | None:
    """The `preexec_fn` that has the kernel kill the started program when the agent dies (None
    where there is no `prctl`). Strictly, when the thread that started it ends: the event loop's,
    which lives as long as the agent. uvloop forks for every start anyway, so it costs nothing
    there; the plain asyncio loop gives up its cheaper vfork for it (about 2 ms a start)."""
    if _prctl is None:
        return None
    return functools.partial(_die_with, os.getpid())


# ---------------------------------------------------------------- process identity


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the sweep needs."""

    pid: int
    name: str
    state: str
    ppid: int
    pgrp: int
    session: int
    start: int  # clock ticks after boot: with the pid and the boot, who the process is

    @property
    def gone(self) -> bool:
        return self.state in ("Z", "X")  # a zombie runs no more: it only waits to be reaped


def read_stat(pid: int) -> ProcStat | None:
    """The process `pid` as /proc shows it now, or None if there is none."""
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The name is in parentheses and may hold anything, spaces and parentheses included.
    head, _, tail = raw.rpartition(b")")
    fields = tail.split()
    try:
        return ProcStat(
            pid=pid,
            name=head.partition(b"(")[2].decode(errors="replace"),
            state=fields[0].decode(),
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            session=int(fields[3]),
            start=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


@functools.cache
def boot_id() -> str:
    """This boot's id: a start time means something only within the boot that counted it."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def child_start(pid: int) -> int:
    """The start time of this process's child `pid`, 0 if it cannot be told (gone already)."""
    stat = read_stat(pid)
    # Our own unreaped child cannot have been replaced; a process with another parent is not it.
    return stat.start if stat is not None and stat.ppid == os.getpid() else 0


# ---------------------------------------------------------------- 2. recording what a command starts


def mark(ledger_id: str, batch_id: str, call_id: str) -> str:
    """The value of `MARK_VAR` in the environment of what a call starts."""
    return f"{ledger_id}:{batch_id}:{call_id}"


class Recorder:
    """What `ProcessTracker` tells the ledger (`toolsets.base.ProcessWatcher`): each process
    group a tool starts (`spawned`) and reaps (`reaped`), and the mark its processes carry.

    `running`: the batch and call running now (the agent's), which the processes belong to."""

    def __init__(self, ledger: Ledger, running: Callable[[], tuple[str, str] | None]) -> None:
        self.ledger = ledger
        self.running = running
        self.boot = boot_id()
        self._starts: dict[int, int] = {}

    def mark(self) -> str:
        batch_id, call_id = self.running() or ("", "")
        return mark(self.ledger.identity, batch_id, call_id)

    def spawned(self, pid: int) -> None:
        batch_id, call_id = self.running() or ("", "")
        start = child_start(pid)
        self._starts[pid] = start
        self.ledger.record_process(ProcessRecord(pid, start, self.boot, batch_id, call_id))

    def reaped(self, pid: int) -> None:
        start = self._starts.pop(pid, None)
        if start is not None:
            self.ledger.process_reaped(pid, start)
