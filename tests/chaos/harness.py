"""Building blocks of the fault matrix: a DAG of about a hundred nodes whose every execution leaves
a file on its device's disk, the three agents of one case, the controls a person gives during the
fault (`Controls`: a stop, a cancel and an approval, on three agents more), and bounded waits on
what the disks and the API say. The referee is tests/chaos/invariants.py."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.chaos.invariants import (
    ASKED,
    CANCEL_HELD,
    CANCEL_THEN,
    OUTAGE,
    STOP_AFTER,
    STOP_HELD,
    VERBS,
    Answer,
    ControlsSeen,
    Execution,
    InvariantViolation,
    Verdict,
    executions_on_disk,
    finished_on_disk,
    held_argv,
    judge,
    judge_controls,
    marker_argv,
)
from tests.support import TASK_ENDS, Agent, Fleet, Server, wait_until

PAUSE_S = 0.03  # how long each command lingers after leaving its mark: keeps work in flight
TASK_TIMEOUT_S = 150.0
STALL_S = 15.0  # no progress for this long: stuck (every recovery here takes a few seconds)
FAILS_ON_PURPOSE = {"bad": {"tool_error"}}
HELD_S = 300  # a held command sleeps far past any case: only a kill ends it before the case does
CONTROL_BOUND_S = 45.0  # a control request answered, or its effect seen, within this (outages included)
REQUEST_S = 40.0  # one try of a control request: a replica asks the leader for 30 s before it says 503
APPROVE_SHELL = {"ORRERY_AGENT_APPROVAL_REQUIRED": '["shell.run"]'}


@dataclass(frozen=True)
class Workload:
    """The DAG of one case, pinned to its devices so a fault cannot shift work between them."""

    dag: dict[str, Any]
    expected_failures: Mapping[str, Collection[str]]

    @property
    def size(self) -> int:
        return len(self.dag["nodes"])

    def placed_on(self, device_id: str) -> int:
        """How many of the nodes are pinned to `device_id`."""
        return sum(1 for n in self.dag["nodes"] if n["placement"]["device"] == device_id)


def workload(
    devices: Sequence[str], independent: int = 75, chains: int = 6, chain_len: int = 5, fan_in: int = 12
) -> Workload:
    """Mostly independent nodes, some chains that cross devices, a fan-in, an `always` edge and a
    node that fails on purpose with its compensation (SPEC section 2 edges), spread round-robin
    over `devices` (ids). Every command leaves one execution marker (invariants.marker_argv).

    About a hundred nodes (110 by default; there were 200): what is proven is that the fault lands
    while work is in flight and that every node then ends right, which a case checks each time
    (`Case.fault`), not how much work there is."""
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
    controls: Controls | None = None  # given during the fault; judged with the workload
    interrupted: dict[str, int] = field(default_factory=dict)
    lost_devices: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    # Each fault as it was injected: what, whose executions, how many were on disk, out of how many.
    faults: list[tuple[str, str, int, int]] = field(default_factory=list)

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

    def fault(self, what: str, agent: Agent | None = None) -> None:
        """Note a fault just before it is injected (after, for an agent that killed itself): how
        much of the work (of `agent`, or of the whole case) is on disk. `finish` requires that some
        had run and some had not, so every case proves that its fault landed mid-run."""
        share = self.work.placed_on(agent.device_id) if agent is not None else self.work.size
        self.faults.append((what, agent.name if agent is not None else "all agents", self.executed(agent), share))

    def faults_landed_mid_run(self) -> None:
        assert self.faults, "the case injected no fault (call Case.fault when it does)"
        for what, who, done, share in self.faults:
            assert 0 < done < share, (
                f"the fault ({what}) did not land mid-run: {done} of {share} executions of {who} were on disk"
            )

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
        self.faults_landed_mid_run()
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
        if self.controls is not None:
            given = self.controls.judge()
            for invariant, offenders in given.broken.items():
                verdict.add(invariant, offenders)
            self.notes += self.controls.notes
            print(f"controls: {given.summary()}; answers: {self.controls.said()}")  # shown with pytest -rP
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
        agents = self.agents + (self.controls.agents if self.controls is not None else [])
        paths = [str(s.log_path) for s in servers] + [str(a.log_path) for a in agents]
        return "\nlogs: " + " ".join(paths)


StartAgent = Callable[[str, dict[str, str]], Agent]
"""Enroll and start an agent of a given name and environment, without waiting for it."""


class Controls:
    """What a person asks during a case's fault, on three agents of the case's own besides its
    workload's: an emergency stop of a device running a held command (then, once the device has
    applied it, a resume), a cancel of a task whose held command runs, and a decision on an
    approval an agent asks before its `shell.run`. `arm` gets them ready before the fault, `act`
    gives them during it (each request asked again while the API answers 503 or not at all),
    and `judge` (called by `Case.finish`) collects what became of them for
    invariants.judge_controls."""

    def __init__(
        self,
        fleet: Fleet,
        prefix: str,
        decision: str,
        start: StartAgent | None = None,
        outage: tuple[int, ...] = OUTAGE,
    ) -> None:
        begin = start or (lambda name, env: fleet.agent(name, wait=False, **env))
        self.fleet, self.decision, self.verb, self.outage = fleet, decision, VERBS[decision], outage
        self.stopped = begin(f"{prefix}-stop", {})
        self.cancelled = begin(f"{prefix}-cancel", {})
        self.asked = begin(f"{prefix}-ask", APPROVE_SHELL)
        self.agents = [self.stopped, self.cancelled, self.asked]
        self.tasks: dict[str, str] = {}  # "stop", "cancel", "ask" -> task id
        self.approval_id = ""
        self.sent: dict[str, float] = {}
        self.answers: dict[str, list[Answer]] = {c: [] for c in ("stop", "resume", "cancel", self.verb)}
        self.notes: list[str] = []
        self._threads: list[threading.Thread] = []
        self._acted = time.monotonic()

    def arm(self) -> Controls:
        """Until the held commands run and the approval is asked (bounded)."""
        for agent in self.agents:
            self.fleet.wait_device(agent.device_id, "idle")
        stop, cancel, ask = (a.device_id for a in self.agents)
        self.tasks["stop"] = self._submit(
            [_held(STOP_HELD, stop), _marked(STOP_AFTER, stop)], [(STOP_HELD, STOP_AFTER, "always")]
        )
        # Retried if it fails: a cancel that left it failing instead would show a second run.
        retried = {**_held(CANCEL_HELD, cancel), "retry": {"max_attempts": 3, "backoff_s": 0}}
        self.tasks["cancel"] = self._submit(
            [retried, _marked(CANCEL_THEN, cancel)], [(CANCEL_HELD, CANCEL_THEN, "success")]
        )
        self.tasks["ask"] = self._submit([_marked(ASKED, ask)], [])
        wait_until(
            lambda: STOP_HELD in self.executions() and CANCEL_HELD in self.executions(),
            30,
            "the held commands to start",
        )
        self.approval_id = wait_until(self._pending, 30, f"the approval of task {self.tasks['ask']} to be asked")
        return self

    def act(self, via: Server) -> None:
        """Give the stop and then the resume, the cancel and the decision through `via`'s API,
        each in a thread of its own (a request may wait out the outage); returns at once."""
        self._acted = time.monotonic()
        chains = {"stop": self._stop_then_resume, "cancel": self._cancel, self.verb: self._decide}
        for name, chain in chains.items():
            thread = threading.Thread(target=self._run, args=(name, chain, via), name=f"control-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def said(self) -> str:
        """The API's answers to each control request, in order (for the report)."""

        def runs(answers: list[Answer]) -> str:
            grouped = [(said, len(list(same))) for said, same in itertools.groupby(map(str, answers))]
            return ", ".join(f"{said} x{n}" if n > 1 else said for said, n in grouped) or "not asked"

        return "; ".join(f"{c}: {runs(a)}" for c, a in self.answers.items())

    def answered(self) -> bool:
        """Whether the stop, the cancel and the decision have had their final answers."""
        return all(self._final(c) is not None for c in ("stop", "cancel", self.verb))

    def judge(self) -> Verdict:
        """Wait (bounded) for the controls to settle, then judge what they left."""
        return judge_controls(self.seen())

    def seen(self) -> ControlsSeen:
        # The stop's chain makes up to three bounded waits, each try of a request up to REQUEST_S.
        deadline = self._acted + 3 * (CONTROL_BOUND_S + REQUEST_S)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self.notes.append(f"{thread.name} still waits for an answer")
        try:
            wait_until(self._settled, CONTROL_BOUND_S, "the control tasks to end, the approval to be decided", 0.25)
        except AssertionError as exc:
            self.notes.append(str(exc))
        runs = self.executions()
        return ControlsSeen(
            decision=self.decision,
            stop_task=self._read(f"/v1/tasks/{self.tasks['stop']}"),
            cancel_task=self._read(f"/v1/tasks/{self.tasks['cancel']}"),
            ask_task=self._read(f"/v1/tasks/{self.tasks['ask']}"),
            approval=self._read(f"/v1/approvals/{self.approval_id}"),
            stopped_device=self._read(f"/v1/devices/{self.stopped.device_id}"),
            stopped_device_id=self.stopped.device_id,
            executions=runs,
            finished=finished_on_disk(self.workspaces()),
            still_running=[
                e.path.name for n in (STOP_HELD, CANCEL_HELD) for e in runs.get(n, []) if _group_alive(e.pid)
            ],
            sent=dict(self.sent),
            answers={c: list(a) for c, a in self.answers.items()},
            outage=self.outage,
        )

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()

    # ------------------------------------------------------------ the disks and the API

    def workspaces(self) -> dict[str, Path]:
        return {a.device_id: a.workspace for a in self.agents}

    def executions(self) -> dict[str, list[Execution]]:
        return executions_on_disk(self.workspaces())

    def _submit(self, nodes: list[dict[str, Any]], edges: list[tuple[str, str, str]]) -> str:
        dag = {"nodes": nodes, "edges": [{"from": a, "to": b, "on": on} for a, b, on in edges]}
        return str(self.fleet.submit(dag)["id"])

    def _pending(self) -> str:
        with self.fleet.server.client() as c:
            r = c.get("/v1/approvals", params={"state": "pending", "task_id": self.tasks["ask"]})
            items = r.json()["items"] if r.status_code == 200 else []
        return str(items[0]["id"]) if items else ""

    def _read(self, path: str, via: Server | None = None) -> dict[str, Any]:
        """GET `path` (of the case's current server unless `via`); {} if it cannot be read now."""
        with contextlib.suppress(httpx.HTTPError, ValueError), (via or self.fleet.server).client() as c:
            r = c.get(path, timeout=10)
            if r.status_code == 200:
                body: dict[str, Any] = r.json()
                return body
        return {}

    def _settled(self) -> bool:
        ended = all(self._read(f"/v1/tasks/{t}").get("state") in TASK_ENDS for t in self.tasks.values())
        decided = self._read(f"/v1/approvals/{self.approval_id}").get("state") not in (None, "pending")
        runs = self.executions()
        dead = not any(_group_alive(e.pid) for n in (STOP_HELD, CANCEL_HELD) for e in runs.get(n, []))
        return ended and decided and dead

    # ------------------------------------------------------------ the requests

    def _run(self, name: str, chain: Callable[[Server], None], via: Server) -> None:
        try:
            chain(via)
        except Exception as exc:  # a thread's failure is reported with the verdict, never lost
            self.notes.append(f"the {name} request failed: {type(exc).__name__}: {exc}")

    def _ask(self, via: Server, control: str, path: str) -> Answer:
        """POST `path` until it is answered with anything but an outage's answer (bounded); every
        answer is kept."""
        answers = self.answers[control]
        self.sent.setdefault(control, time.time())

        def once() -> Answer | None:
            try:
                with via.client() as c:
                    r = c.post(path, timeout=REQUEST_S)
            except httpx.HTTPError as exc:
                answers.append(Answer(0, error=f"no answer ({type(exc).__name__})"))
                return None
            try:
                body = r.json()
            except ValueError:
                body = {"code": r.text[:100]}
            answers.append(Answer(r.status_code, body if isinstance(body, dict) else {}))
            return None if r.status_code in self.outage else answers[-1]

        return wait_until(once, CONTROL_BOUND_S, f"POST {path} to be answered", interval=0.25)

    def _final(self, control: str) -> Answer | None:
        answers = self.answers.get(control) or []
        return answers[-1] if answers and answers[-1].status not in self.outage else None

    def _stop_then_resume(self, via: Server) -> None:
        device = self.stopped.device_id
        stopped = self._ask(via, "stop", f"/v1/devices/{device}/stop")
        generation = int(stopped.body.get("control_generation") or 0)
        # Resumed only once the device has applied the stop (a resume it heard first would leave
        # it nothing to kill), so the resume comes under the fault or right after it.
        try:
            wait_until(
                lambda: self._stop_applied(via, generation),
                CONTROL_BOUND_S,
                "the stopped device to apply the stop and its command to die",
                interval=0.25,
            )
        except AssertionError as exc:
            self.notes.append(str(exc))
        self.sent["resume"] = time.time()
        self._ask(via, "resume", f"/v1/devices/{device}/resume")

    def _stop_applied(self, via: Server, generation: int) -> bool:
        held = self.executions().get(STOP_HELD, [])
        if any(_group_alive(e.pid) for e in held):
            return False
        applied = self._read(f"/v1/devices/{self.stopped.device_id}", via).get("control_applied")
        return isinstance(applied, int) and applied >= generation > 0

    def _cancel(self, via: Server) -> None:
        self._ask(via, "cancel", f"/v1/tasks/{self.tasks['cancel']}/cancel")

    def _decide(self, via: Server) -> None:
        self._ask(via, self.verb, f"/v1/approvals/{self.approval_id}/{self.verb}")


def _held(node_id: str, device: str) -> dict[str, Any]:
    argv = held_argv(node_id, HELD_S)
    command = {"tool": "shell.run", "arguments": {"argv": argv, "timeout_s": 2 * HELD_S}, "timeout_s": 2 * HELD_S}
    return {"id": node_id, "placement": {"device": device}, "commands": [command]}


def _marked(node_id: str, device: str) -> dict[str, Any]:
    command = {"tool": "shell.run", "arguments": {"argv": marker_argv(node_id)}, "timeout_s": 60}
    return {"id": node_id, "placement": {"device": device}, "commands": [command]}


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (a zombie, dead but not yet reaped, does not:
    Linux's /proc tells them apart). `shell.run` starts each command as a group of its own whose
    leader is the command's first process, so `echo $$` in `sh -c` names it."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            state, _parent, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) == pgid and state != "Z":
                return True
    return False


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
