"""Building blocks of the fault matrix: a DAG of a few hundred nodes whose every execution leaves
a file on its device's disk, the three agents of one case, and bounded waits on what the disks and
the API say. The referee is tests/chaos/invariants.py."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.chaos.invariants import Execution, InvariantViolation, Verdict, executions_on_disk, judge, marker_argv
from tests.support import Agent, Fleet, wait_until

PAUSE_S = 0.03  # how long each command lingers after leaving its mark: keeps work in flight
TASK_TIMEOUT_S = 150.0
STALL_S = 15.0  # no progress for this long: stuck (every recovery here takes a few seconds)
FAILS_ON_PURPOSE = {"bad": {"tool_error"}}


@dataclass(frozen=True)
class Workload:
    """The DAG of one case, pinned to its devices so a fault cannot shift work between them."""

    dag: dict[str, Any]
    expected_failures: Mapping[str, Collection[str]]

    @property
    def size(self) -> int:
        return len(self.dag["nodes"])


def workload(
    devices: Sequence[str], independent: int = 165, chains: int = 6, chain_len: int = 5, fan_in: int = 12
) -> Workload:
    """Mostly independent nodes, some chains that cross devices, a fan-in, an `always` edge and a
    node that fails on purpose with its compensation (SPEC section 2 edges), spread round-robin
    over `devices` (ids). Every command leaves one execution marker (invariants.marker_argv)."""
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, str]] = []

    def node(node_id: str, device: str, then: str = f"sleep {PAUSE_S}") -> None:
        command = {"tool": "shell.run", "arguments": {"argv": marker_argv(node_id, then)}, "timeout_s": 60}
        nodes.append({"id": node_id, "placement": {"device": device}, "commands": [command]})

    def edge(source: str, target: str, on: str = "success") -> None:
        edges.append({"from": source, "to": target, "on": on})

    for i in range(independent):
        node(f"i{i:03d}", devices[i % len(devices)])
    for c in range(chains):
        for j in range(chain_len):
            node(f"c{c}s{j}", devices[(c + j) % len(devices)])
            if j:
                edge(f"c{c}s{j - 1}", f"c{c}s{j}")
    node("join", devices[0])
    for i in range(0, independent, max(1, independent // fan_in))[:fan_in]:
        edge(f"i{i:03d}", "join")
    node("bad", devices[1 % len(devices)], then="exit 3")
    node("undo", devices[2 % len(devices)])
    node("never", devices[0])
    node("tidy", devices[2 % len(devices)])
    edge("bad", "undo", "failure")
    edge("bad", "never")
    edge("never", "tidy", "always")
    edge("join", "tidy", "always")
    return Workload({"nodes": nodes, "edges": edges}, FAILS_ON_PURPOSE)


@dataclass
class Case:
    """One fault case: the fleet it runs on (a `Fleet` or a `ReplicaSet`), its own agents, its
    workload and task. Cases that share a fleet never share agents, devices or tasks."""

    fleet: Fleet
    agents: list[Agent]
    spread_over: list[Agent] = field(default_factory=list)  # round-robin placement; default: `agents`
    work: Workload = field(init=False)
    task_id: str = ""
    interrupted: dict[str, int] = field(default_factory=dict)
    lost_devices: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.work = workload([a.device_id for a in self.spread_over or self.agents])

    def submit(self) -> str:
        self.task_id = self.fleet.submit(self.work.dag)["id"]
        return self.task_id

    # ------------------------------------------------------------ the disks

    def workspaces(self) -> dict[str, Path]:
        return {a.device_id: a.workspace for a in self.agents}

    def executions(self) -> dict[str, list[Execution]]:
        return executions_on_disk(self.workspaces())

    def executed(self, agent: Agent | None = None) -> int:
        """Executions on disk so far, of one agent or of all."""
        chosen = [agent] if agent is not None else self.agents
        return sum(len(list((a.workspace / "runs").iterdir())) for a in chosen if (a.workspace / "runs").is_dir())

    def wait_executed(self, count: int, agent: Agent | None = None, timeout: float = 90) -> int:
        """Until at least `count` executions are on disk (of `agent`, or of all); fails early if
        none is added for `STALL_S`."""
        who = agent.name if agent is not None else "all agents"
        start = time.monotonic()
        deadline = start + timeout
        seen, moved = -1, start
        while (now := self.executed(agent)) < count:
            if now != seen:
                seen, moved = now, time.monotonic()
            if time.monotonic() - moved > STALL_S or time.monotonic() > deadline:
                raise AssertionError(
                    f"waiting for {count} executions ({who}): {now} after {time.monotonic() - start:.0f}s, "
                    f"none for the last {time.monotonic() - moved:.0f}s{self.logs()}"
                )
            time.sleep(0.1)
        return now

    # ------------------------------------------------------------ the API

    def task(self) -> dict[str, Any]:
        with self.fleet.server.client() as c:
            r = c.get(f"/v1/tasks/{self.task_id}")
            r.raise_for_status()
            result: dict[str, Any] = r.json()
            return result

    def wait_ended(self, timeout: float = TASK_TIMEOUT_S, stall_s: float = STALL_S) -> dict[str, Any]:
        """Poll (bounded) until the task is terminal, or nothing moved (no node changed state, no
        new execution on disk) for `stall_s`; return its last detail either way, so the referee
        can name the nodes that never ended."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        progress: tuple[Any, ...] = ()
        moved = time.monotonic()
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):  # a replica restarting, a request cut: ask again
                last = self.task()
            if last is not None and last["state"] in ("succeeded", "failed", "cancelled"):
                return last
            now = (tuple(sorted((last or {}).get("node_counts", {}).items())), self.executed())
            if now != progress:
                progress, moved = now, time.monotonic()
            elif time.monotonic() - moved > stall_s:
                self.notes.append(f"nothing moved for {stall_s:.0f}s; judged as it stands")
                break
            time.sleep(0.5)
        if last is None:
            raise AssertionError(f"task {self.task_id} could not be read for {timeout}s{self.logs()}")
        if last["state"] not in ("succeeded", "failed", "cancelled"):
            self.notes.append(f"the task was still {last['state']} when judged")
        return last

    def settle(self, timeout: float = 20) -> None:
        """Let the devices finish what they hold (so a late duplicate execution is seen)."""

        def calm() -> bool:
            try:
                return all(self.fleet.device(a.device_id)["state"] != "busy" for a in self.agents)
            except (httpx.HTTPError, KeyError, ValueError):
                return False

        try:
            wait_until(calm, timeout, "the case's devices to be free", interval=0.25)
        except AssertionError as exc:
            self.notes.append(str(exc))

    def finish(self, timeout: float = TASK_TIMEOUT_S) -> Verdict:
        """Wait for the task to end, then judge it; fail with every broken invariant and where the
        logs are."""
        task = self.wait_ended(timeout)
        self.settle()
        self.lost_devices |= self.declared_offline()
        verdict = judge(
            task,
            self.executions(),
            expected_failures=self.work.expected_failures,
            interrupted=self.interrupted,
            lost_devices=self.lost_devices,
        )
        if not verdict.ok:
            notes = "".join(f"\nnote: {n}" for n in self.notes)
            raise AssertionError(f"{InvariantViolation(verdict)}{notes}{self.logs()}")
        print(f"verdict: {verdict.summary()}")  # shown with pytest -rP
        return verdict

    def declared_offline(self) -> set[str]:
        """The case's devices the server's durable device history shows going `offline` (e.g. an
        agent on a loaded machine that took longer than the heartbeat timeout to come back): for
        those, `device_lost` is the honest failure code."""
        found = set()
        with self.fleet.server.client() as c:
            for agent in self.agents:
                r = c.get(f"/v1/devices/{agent.device_id}/history", params={"limit": 500})
                if r.status_code == 200 and any(h["state"] == "offline" for h in r.json()["items"]):
                    found.add(agent.device_id)
        for device_id in sorted(found - self.lost_devices):
            self.notes.append(f"the server declared {device_id} offline during the case")
        return found

    def logs(self) -> str:
        servers = getattr(self.fleet, "replicas", [self.fleet.server])
        paths = [str(s.log_path) for s in servers] + [str(a.log_path) for a in self.agents]
        return "\nlogs: " + " ".join(paths)


class StateWatch:
    """Reads a device's state through the API every `interval` in a thread and keeps what it saw:
    to show that something never happened (a device declared offline), one must look all along."""

    def __init__(self, fleet: Fleet, device_id: str, interval: float = 0.25) -> None:
        self.fleet, self.device_id, self.interval = fleet, device_id, interval
        self.seen: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                self.seen.append((time.monotonic(), str(self.fleet.device(self.device_id)["state"])))

    def watch_until(self, when: float) -> list[tuple[float, str]]:
        """Keep watching until `when` (time.monotonic()), then stop; what was seen."""
        self._stop.wait(max(0.0, when - time.monotonic()))
        self._stop.set()
        self._thread.join(5)
        return self.seen

    def states(self) -> list[str]:
        """The states seen, each run of repeats counted once."""
        runs = [s for _, s in self.seen]
        return [s for i, s in enumerate(runs) if i == 0 or runs[i - 1] != s]


def wait_killed(agent: Agent, timeout: float = 60) -> int:
    """Until the agent's process is gone; its exit status (negative: the signal that ended it)."""
    assert agent.proc is not None
    proc = agent.proc
    wait_until(lambda: proc.poll() is not None, timeout, f"agent {agent.name} to crash")
    return int(proc.returncode)


def restart_without(agent: Agent, *names: str) -> Agent:
    """Start a stopped agent again on the same data dir, without the given variables."""
    agent.env = {k: v for k, v in agent.env.items() if k not in names}
    return agent.start()


def kill_agent(agent: Agent) -> None:
    """SIGKILL the agent's whole process group (its tool servers and commands with it)."""
    agent.signal(signal.SIGKILL)
    if agent.proc is not None:
        agent.proc.wait(timeout=30)


Fault = Callable[[Case], None]
