"""Processes a command leaves running when its agent dies, and how the next agent ends them.

`shell.run` starts each program in a session of its own, so that a timeout or a cancel kills
everything it started with one group kill. The same separation means that a `kill -9` of the
agent kills none of it. Left alone, the command would run on, unseen, while the restarted agent
reports its call `uncertain`, the orchestrator probes the device (`verify`) and judges it, and a
retry of the node runs next to it: two executions of one node at once, and a probe judging a
device while the node's command still runs. Three things prevent that (SPEC section 4: a batch
runs at most once; section 5):

1. The program a tool starts gets the parent-death signal (`PR_SET_PDEATHSIG`, SIGKILL,
   `preexec`): the kernel kills it when the agent dies. Only it: its children are re-parented
   and live on, hence 2 and 3.
2. Every process group a command starts is in the ledger as soon as its start returns
   (`Recorder.spawned`, one small write), with its leader's identity: start time and boot id.
   Every child's environment carries `ORRERY_AGENT_RUN=<ledger id>:<batch>:<call>` (`mark`),
   which its own children inherit, also those started before the row was written and those
   that left the group (setsid).
3. When an agent starts, before its ledger's recovery reports anything, `end_orphans` kills
   every recorded group still alive and every process carrying its ledger's mark, waits (at
   most `SWEEP_WAIT_S`) until they are gone, and clears the records. Only then is the
   interrupted call reported `uncertain`, saying what could not be killed, if anything.

Never killing a stranger after pid reuse: Linux frees a pid number only once no task uses it as
its pid, its process group id or its session id. So, for a recorded group P:
- a process P with the recorded start time (same boot): the leader is ours, so is the group;
- a process P with another start time: the number was reused, so everything of ours that used
  it is gone; nothing is killed for that record;
- no process P, but processes in group or session P: they are all ours or all a stranger's (a
  stranger could take the number only once ours had let it go). One carrying our mark proves
  them ours; if none does, they are left alone and the call's result says so.
A kill goes through a pidfd, checked against the start time seen in the scan after it is
opened, so a process that ended and whose pid was reused in between is never signalled.

Out of reach: a process that left the session and dropped its environment too (`setsid env -i
...`), and processes the agent's user may not signal (a setuid program): these are named in the
result. Linux only: elsewhere nothing is recorded and nothing swept.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from device_agent.ledger import Ledger, ProcessRecord

log = logging.getLogger("orrery.agent")

MARK_VAR = "ORRERY_AGENT_RUN"
SWEEP_WAIT_S = 5.0  # after the kills, how long to wait for the processes to be gone
_POLL_S = 0.01
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


# ---------------------------------------------------------------- 3. the sweep at start


@dataclass(frozen=True)
class Leftover:
    """A process the last run left, and the call it belongs to."""

    pid: int
    start: int
    name: str
    batch_id: str
    call_id: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.name})"


@dataclass
class Sweep:
    """What `sweep` did: the processes it killed, and those it left alone with the reason."""

    killed: list[Leftover] = field(default_factory=list)
    spared: list[tuple[Leftover, str]] = field(default_factory=list)

    def notes(self) -> dict[tuple[str, str], str]:
        """Per (batch, call): what the call's `uncertain` result should say about its processes."""
        killed: dict[tuple[str, str], int] = {}
        for p in self.killed:
            killed[p.batch_id, p.call_id] = killed.get((p.batch_id, p.call_id), 0) + 1
        spared: dict[tuple[str, str], list[str]] = {}
        for p, why in self.spared:
            spared.setdefault((p.batch_id, p.call_id), []).append(f"{p}: {why}")
        notes = {}
        for key in killed.keys() | spared.keys():
            parts = []
            if key in killed:
                parts.append(
                    f"the agent killed the {killed[key]} process(es) it had left running before reporting this"
                )
            if key in spared:
                parts.append(
                    "these processes it may have started are still running, so it may still be taking effect: "
                    + "; ".join(spared[key])
                )
            notes[key] = "; ".join(parts)
        return notes


def sweep(records: Iterable[ProcessRecord], ledger_id: str, wait_s: float = SWEEP_WAIT_S) -> Sweep:
    """Kill what the last run of this ledger's agent left running (see the module's text), and
    wait, at most `wait_s`, until it is gone. Blocking: it polls /proc."""
    result = Sweep()
    if not SUPPORTED:
        return result
    boot = boot_id()
    # A record of an earlier boot: what it names died with the machine. With no boot id to
    # compare, a start time proves nothing, and only the mark is trusted.
    records = [r for r in records if r.boot_id == boot and boot]
    needle = f"{MARK_VAR}={ledger_id}:".encode()
    spare = _own_line()
    ours: set[int] = set()  # groups (and sessions) known to be the last run's
    killed: dict[int, Leftover] = {}
    refused: dict[int, tuple[Leftover, str]] = {}
    deadline = time.monotonic() + wait_s
    while True:  # again until a scan finds nothing new: a process may fork while we kill
        table = {pid: stat for pid, stat in _scan().items() if pid not in spare}
        found = _leftovers(table, records, ours, needle, refused)
        fresh = [p for pid, p in found.items() if pid not in killed and pid not in refused]
        for p in fresh:
            why = _kill(p)
            if why is None:
                killed[p.pid] = p
            else:
                refused[p.pid] = (p, why)
        if not fresh or time.monotonic() >= deadline:
            break
    while killed and time.monotonic() < deadline:
        if not any(_alive(p) for p in killed.values()):
            break
        time.sleep(_POLL_S)
    for p in killed.values():
        if _alive(p):
            refused[p.pid] = (p, f"still alive {wait_s:g} s after SIGKILL")
        else:
            result.killed.append(p)
    result.spared.extend(refused.values())
    return result


def _leftovers(
    table: dict[int, ProcStat],
    records: list[ProcessRecord],
    ours: set[int],
    needle: bytes,
    refused: dict[int, tuple[Leftover, str]],
) -> dict[int, Leftover]:
    """The processes in `table` that are the last run's, by its records and by its mark."""
    found: dict[int, Leftover] = {}
    marked = {pid: call for pid, stat in table.items() if not stat.gone and (call := _marked(pid, needle))}
    for record in records:
        group = record.pgid
        members = [s for s in table.values() if not s.gone and group in (s.pgrp, s.session) and s.pid != group]
        if group not in ours:
            leader = table.get(group)
            if leader is not None:
                if leader.start != record.leader_start:
                    continue  # the number was reused: nothing of ours uses it any more
                ours.add(group)
            elif any(s.pid in marked for s in members):
                ours.add(group)
            else:
                for s in members:  # someone's: ours or a stranger's, nothing tells which
                    p = Leftover(s.pid, s.start, s.name, record.batch_id, record.call_id)
                    refused.setdefault(s.pid, (p, _UNCONFIRMED))
                continue
        leader = table.get(group)
        if leader is not None and not leader.gone and leader.start == record.leader_start:
            members.append(leader)
        for s in members:
            found[s.pid] = Leftover(s.pid, s.start, s.name, record.batch_id, record.call_id)
    for pid, (batch_id, call_id) in marked.items():
        if pid not in found:
            stat = table[pid]
            found[pid] = Leftover(pid, stat.start, stat.name, batch_id, call_id)
    return found


_UNCONFIRMED = (
    "it is in the process group or session of a command of the last run, whose leader is gone, and carries no mark "
    "of this agent, so it could not be told from an unrelated process that reused the number; left alone"
)


def _scan() -> dict[int, ProcStat]:
    table = {}
    for entry in os.scandir(_PROC):
        if entry.name.isdigit() and (stat := read_stat(int(entry.name))) is not None:
            table[stat.pid] = stat
    return table


def _marked(pid: int, needle: bytes) -> tuple[str, str] | None:
    """The (batch, call) of this ledger's mark in `pid`'s environment, if it carries one."""
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # another user's process, or gone
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(needle):
            batch_id, _, call_id = entry[len(needle) :].decode(errors="replace").partition(":")
            return batch_id, call_id
    return None


def _own_line() -> set[int]:
    """This process and its ancestors: never swept, whatever their environment says."""
    line, pid = set(), os.getpid()
    while pid > 0 and pid not in line:
        line.add(pid)
        stat = read_stat(pid)
        pid = stat.ppid if stat is not None else 0
    return line


def _kill(p: Leftover) -> str | None:
    """SIGKILL `p` if it is still the process the scan saw; why not, if it cannot be killed."""
    try:
        fd = os.pidfd_open(p.pid)
    except ProcessLookupError:
        return None  # gone already
    except OSError:  # no pidfds (Linux before 5.3): the start time is checked just before
        return _kill_by_pid(p)
    try:
        now = read_stat(p.pid)
        if now is None or now.start != p.start:
            return None  # it ended and the pid went to another process: not ours to kill
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "the agent's user may not signal it (permission denied)"
    finally:
        os.close(fd)
    return None


def _kill_by_pid(p: Leftover) -> str | None:
    now = read_stat(p.pid)
    if now is None or now.start != p.start:
        return None
    try:
        os.kill(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "the agent's user may not signal it (permission denied)"
    return None


def _alive(p: Leftover) -> bool:
    now = read_stat(p.pid)
    return now is not None and now.start == p.start and not now.gone


async def end_orphans(ledger: Ledger, wait_s: float = SWEEP_WAIT_S) -> dict[tuple[str, str], str]:
    """At agent start, before recovery reports anything: kill what the last run left running,
    clear the records, log it; returns the notes for the interrupted calls' results (`Sweep.notes`)."""
    records = ledger.processes()
    done = await asyncio.to_thread(sweep, records, ledger.identity, wait_s)
    if done.killed:
        log.warning(
            "killed %d process(es) left running by the last run of this agent: %s",
            len(done.killed),
            ", ".join(f"{p} of call {p.call_id} in batch {p.batch_id}" for p in done.killed),
        )
    for p, why in done.spared:
        log.error("a process left running by the last run of this agent was not killed: %s: %s", p, why)
    ledger.clear_processes()
    return done.notes()
