"""The fault matrix's referee: what must hold after any fault, judged from the API's task detail
and from what the commands left on the devices' disks (SPEC sections 2 and 4).

Every node's command creates one uniquely named file per execution in the workspace of the agent
that ran it (`runs/<node>.<nanoseconds>.<pid>`), so the disks say how often each node really ran
and where, whatever the orchestrator believes. `check_task` compares the two:

- every node is terminal;
- 0 lost: a node that the DAG rules say must run did run, and a succeeded node ran exactly once;
- 0 ran twice: no node has more than one execution, counted across every workspace;
- failures are honest: `uncertain` only for a command interrupted on a device that really was
  (0 or 1 executions), `device_lost` only on a device that really was lost (0 or 1 executions),
  a node that fails on purpose fails with its own code after exactly one execution, and nothing
  else fails;
- the outcome is right: skips follow the edges, and the task's state follows the DAG rules.

It collects every broken invariant with the offending nodes before it fails, so one failing
test says everything that went wrong, not just the first thing.

`judge_controls` judges what a person asked during the fault (docs/replicas.md, "Controls"), from
the same disks: an emergency stop killed the running command (`device_stopped`), the device took no
work while stopped and ran work again after the resume; a cancelled task ended `cancelled`, its
command killed and nothing of it run after the cancel; an approval's stored state is the decision
given and the command ran exactly as often as that decision allows; and the API answered each
request as it must under an outage (503 until it could answer, then the control's own answer).
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUNS_DIR = "runs"
FINISHED_DIR = "finished"
TERMINAL = ("succeeded", "failed", "skipped", "cancelled")
RAN = ("succeeded", "failed")
SHOW = 12  # offending nodes listed per invariant


@dataclass(frozen=True)
class Execution:
    """One run of a node's command, as found on a device's disk."""

    node: str
    device_id: str
    path: Path

    @property
    def at(self) -> float:
        """When it started, in seconds since the epoch (the marker's name holds it)."""
        return int(self.path.name.split(".")[1]) / 1e9

    @property
    def pid(self) -> int:
        """The shell that ran it: also its process group, as shell.run starts each command in a
        session of its own."""
        return int(self.path.name.split(".")[2])


def executions_on_disk(workspaces: Mapping[str, Path]) -> dict[str, list[Execution]]:
    """Every execution marker under `<workspace>/runs/`, by node, for workspaces keyed by device id."""
    found: dict[str, list[Execution]] = collections.defaultdict(list)
    for device_id, workspace in workspaces.items():
        runs = workspace / RUNS_DIR
        if not runs.is_dir():
            continue
        for path in runs.iterdir():
            node = path.name.split(".", 1)[0]
            found[node].append(Execution(node, device_id, path))
    return dict(found)


def marker_argv(node: str, then: str = "") -> list[str]:
    """A `shell.run` argv that leaves one uniquely named file per execution, then runs `then`."""
    script = f'mkdir -p {RUNS_DIR} && : > "{RUNS_DIR}/{node}.$(date +%s%N).$$"'
    if then:
        script += f" && {then}"
    return ["sh", "-c", script]


def held_argv(node: str, hold_s: float) -> list[str]:
    """A `shell.run` argv that leaves its execution marker, sleeps `hold_s`, and only then leaves
    `finished/<node>.<pid>`: a mark that exists only if nothing killed the command."""
    return marker_argv(node, f"sleep {hold_s:g} && mkdir -p {FINISHED_DIR} && : > {FINISHED_DIR}/{node}.$$")


def finished_on_disk(workspaces: Mapping[str, Path]) -> list[str]:
    """Every `finished/` mark a held command left (`<device>:<node>.<pid>`)."""
    return sorted(
        f"{device_id}:{path.name}"
        for device_id, workspace in workspaces.items()
        if (workspace / FINISHED_DIR).is_dir()
        for path in (workspace / FINISHED_DIR).iterdir()
    )


@dataclass
class Verdict:
    """What the referee saw: counts for the report, and every broken invariant."""

    nodes: int = 0
    states: collections.Counter[str] = field(default_factory=collections.Counter)
    failure_codes: collections.Counter[str] = field(default_factory=collections.Counter)
    executions: int = 0
    lost: list[str] = field(default_factory=list)
    ran_twice: list[str] = field(default_factory=list)
    broken: dict[str, list[str]] = field(default_factory=dict)

    def add(self, invariant: str, offenders: Iterable[str]) -> None:
        offenders = list(offenders)
        if offenders:
            self.broken.setdefault(invariant, []).extend(offenders)

    @property
    def ok(self) -> bool:
        return not self.broken

    def summary(self) -> str:
        return (
            f"{self.nodes} nodes {dict(self.states)}, failure codes {dict(self.failure_codes)}, "
            f"{self.executions} executions on disk, lost {len(self.lost)}, ran twice {len(self.ran_twice)}"
        )

    def report(self) -> str:
        lines = [f"{len(self.broken)} invariant(s) broken; {self.summary()}"]
        for invariant, offenders in self.broken.items():
            more = f" (+{len(offenders) - SHOW} more)" if len(offenders) > SHOW else ""
            lines.append(f"- {invariant}: {len(offenders)} node(s){more}")
            lines += [f"    {o}" for o in offenders[:SHOW]]
        return "\n".join(lines)


class InvariantViolation(AssertionError):
    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.report())
        self.verdict = verdict


def judge(
    task: Mapping[str, Any],
    executions: Mapping[str, list[Execution]],
    *,
    expected_failures: Mapping[str, Collection[str]] = {},
    interrupted: Mapping[str, int] = {},
    lost_devices: Collection[str] = (),
) -> Verdict:
    """Judge a finished task against the executions found on disk (see the module docstring).

    `expected_failures`: nodes whose command fails on purpose, with the codes it may fail with
    (after exactly one execution). `interrupted`: device id -> how many commands a fault
    interrupted there (each may end `uncertain`). `lost_devices`: devices that really were lost
    (their batches may end `device_lost`).
    """
    nodes = {n["id"]: n for n in task["nodes"]}
    edges = [(e["from"], e["to"], e["on"]) for e in task.get("edges") or []]
    v = Verdict(nodes=len(nodes), executions=sum(len(x) for x in executions.values()))
    v.states.update(n["state"] for n in nodes.values())
    v.failure_codes.update(_code(n) for n in nodes.values() if n["state"] == "failed")
    cancelled_task = task["state"] == "cancelled"

    def runs(node_id: str) -> list[Execution]:
        return executions.get(node_id, [])

    def where(node_id: str) -> str:
        n = nodes[node_id]
        attempts = [
            f"#{a['n']} on {a['device_id']}: {a['status']} {(a.get('error') or {}).get('code', '')}".strip()
            for a in n["attempts"]
        ]
        disk = sorted(f"{e.device_id}:{e.path.name}" for e in runs(node_id))
        return f"{node_id} [{n['state']} {_code(n) or ''}] attempts={attempts} on disk={disk}"

    # 1. Everything ends.
    v.add("not terminal", (where(i) for i, n in nodes.items() if n["state"] not in TERMINAL))
    if not cancelled_task:
        v.add("cancelled in a task nobody cancelled", (where(i) for i, n in nodes.items() if n["state"] == "cancelled"))
    v.add("executions of nodes the task does not have", sorted(set(executions) - set(nodes)))

    # 2. The DAG rules, re-derived from the parents' final states (orchestrator/domain/dag.py).
    incoming: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for source, target, on in edges:
        incoming[target].append((source, on))
    must_run, must_skip = [], []
    for node_id, n in nodes.items():
        if cancelled_task and n["state"] == "cancelled":
            continue
        verdicts = [_edge(on, nodes[src]["state"]) for src, on in incoming[node_id]]
        if any(x is False for x in verdicts):
            if n["state"] != "skipped":
                must_skip.append(node_id)
        elif all(x is True for x in verdicts) and n["state"] not in RAN:
            must_run.append(node_id)
    v.add("lost: the DAG rules say it must run, but it did not run", map(where, must_run))
    v.add("ran or was kept although an edge can never be satisfied (should be skipped)", map(where, must_skip))

    # 3. Exactly-once, judged from the disks.
    twice = [i for i in nodes if len(runs(i)) > 1]
    v.ran_twice = twice
    v.add("ran twice: more than one execution on disk", (where(i) for i in twice))
    no_run = [i for i, n in nodes.items() if n["state"] == "succeeded" and not runs(i)]
    v.add("lost: succeeded without any execution on disk", (where(i) for i in no_run))
    v.lost = [*no_run, *must_run]
    v.add("never ran yet executed on disk", (where(i) for i, n in nodes.items() if n["state"] == "skipped" and runs(i)))
    wrong_place = []
    for node_id, n in nodes.items():
        ran_on = {a["device_id"] for a in n["attempts"]}
        if any(e.device_id not in ran_on for e in runs(node_id)):
            wrong_place.append(where(node_id))
    v.add("executed on a device none of its attempts was sent to", wrong_place)

    # 4. Honest failures.
    budget = dict(interrupted)
    dishonest = []
    for node_id, n in nodes.items():
        if n["state"] != "failed":
            continue
        code, count = _code(n), len(runs(node_id))
        device = str(n["attempts"][-1]["device_id"]) if n["attempts"] else ""
        if code == "uncertain":
            if budget.get(device, 0) <= 0:
                dishonest.append(f"{where(node_id)}: uncertain, but no fault interrupted a command on that device")
            elif count > 1:
                dishonest.append(f"{where(node_id)}: uncertain needs 0 or 1 executions")
            else:
                budget[device] -= 1
        elif code == "device_lost":
            if device not in lost_devices:
                dishonest.append(f"{where(node_id)}: device_lost, but that device was never lost")
            elif count > 1:
                dishonest.append(f"{where(node_id)}: device_lost needs 0 or 1 executions")
        elif node_id in expected_failures:
            if code not in expected_failures[node_id]:
                dishonest.append(
                    f"{where(node_id)}: fails on purpose, with one of {sorted(expected_failures[node_id])}"
                )
            elif count != 1:
                dishonest.append(f"{where(node_id)}: its own failure needs exactly one execution")
        else:
            dishonest.append(f"{where(node_id)}: failed with {code!r}, which no fault here explains")
    v.add("dishonest failure", dishonest)

    # 5. The task's outcome follows the DAG rules (SPEC section 2).
    handled = {source for source, _, on in edges if on == "failure"}
    if not cancelled_task and all(n["state"] in TERMINAL for n in nodes.values()):
        unhandled = [i for i, n in nodes.items() if n["state"] == "failed" and i not in handled]
        expected = "failed" if unhandled else "succeeded"
        if task["state"] != expected:
            v.add(
                f"task state {task['state']!r}, but the DAG rules make it {expected!r}",
                [f"unhandled failures: {unhandled}"],
            )
    return v


def check_task(
    task: Mapping[str, Any],
    executions: Mapping[str, list[Execution]],
    *,
    expected_failures: Mapping[str, Collection[str]] = {},
    interrupted: Mapping[str, int] = {},
    lost_devices: Collection[str] = (),
) -> Verdict:
    """`judge`, then fail with every broken invariant and its offending nodes."""
    verdict = judge(
        task, executions, expected_failures=expected_failures, interrupted=interrupted, lost_devices=lost_devices
    )
    if not verdict.ok:
        raise InvariantViolation(verdict)
    return verdict


def _code(node: Mapping[str, Any]) -> str:
    return str((node.get("error") or {}).get("code") or "")


def _edge(on: str, source_state: str) -> bool | None:
    """True: satisfied; False: never satisfiable; None: the source has not ended (SPEC section 2)."""
    if source_state not in TERMINAL:
        return None
    if on == "success":
        return source_state == "succeeded"
    if on == "failure":
        return source_state == "failed"
    return source_state != "cancelled"  # always


# ================================================================ controls given during the fault

# The control tasks' nodes (each task on a device of its own).
STOP_HELD, STOP_AFTER = "stop-held", "stop-after"  # held when the device is stopped; runs after the resume
CANCEL_HELD, CANCEL_THEN = "cancel-held", "cancel-then"  # held when its task is cancelled; never runs
ASKED = "asked"  # waits for the approval
VERBS = {"approved": "approve", "denied": "deny"}
# What each request must end with. Before it, only an outage's answers: 503 `cluster_unavailable`,
# or no answer at all (a connection refused or cut: status 0), each asked again.
FINAL = {"stop": (200,), "resume": (200,), "cancel": (202,), "approve": (200, 202), "deny": (200, 202)}
OUTAGE = (0, 503)


@dataclass(frozen=True)
class Answer:
    """One answer the API gave a control request (status 0: none came, `error` says why)."""

    status: int
    body: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""

    def __str__(self) -> str:
        said = self.body.get("code") or self.body.get("state") or ""
        return self.error or f"{self.status} {said}".strip()


@dataclass
class ControlsSeen:
    """What a case's stop, cancel and approval left behind, as the API and the disks tell it."""

    decision: str  # "approved" or "denied": what the operator decided
    stop_task: dict[str, Any]  # task details as last read ({}: never read)
    cancel_task: dict[str, Any]
    ask_task: dict[str, Any]
    approval: dict[str, Any]  # the approval as last read
    stopped_device: dict[str, Any]  # the stopped device as last read
    stopped_device_id: str
    executions: dict[str, list[Execution]]  # the control tasks' executions on the control devices' disks
    finished: list[str]  # the held commands' `finished/` marks (finished_on_disk)
    still_running: list[str]  # the held commands whose process group lives on
    sent: dict[str, float]  # control -> time.time() its first request went ("stop", "resume", "cancel")
    answers: dict[str, list[Answer]]  # control ("stop", "resume", "cancel", "approve"/"deny") -> answers
    outage: tuple[int, ...] = OUTAGE  # the answers the fault may bring, each asked again


def judge_controls(seen: ControlsSeen) -> Verdict:
    """Judge the stop, the cancel and the approval of a case (see the module docstring)."""
    tasks = (seen.stop_task, seen.cancel_task, seen.ask_task)
    nodes = [n for t in tasks for n in t.get("nodes") or ()]
    v = Verdict(nodes=len(nodes), executions=sum(len(x) for x in seen.executions.values()))
    v.states.update(n["state"] for n in nodes)
    v.failure_codes.update(_code(n) for n in nodes if n["state"] == "failed")

    def node(task: Mapping[str, Any], node_id: str) -> Mapping[str, Any]:
        return next((n for n in task.get("nodes") or () if n["id"] == node_id), {"id": node_id, "attempts": []})

    def runs(node_id: str) -> list[Execution]:
        return seen.executions.get(node_id, [])

    def where(task: Mapping[str, Any], node_id: str) -> str:
        n = node(task, node_id)
        attempts = [f"#{a['n']}: {a['status']} {(a.get('error') or {}).get('code', '')}".strip() for a in n["attempts"]]
        disk = sorted(e.path.name for e in runs(node_id))
        return f"{node_id} [{n.get('state')} {_code(n) or ''}] attempts={attempts} on disk={disk}"

    # The stop: the command it found running was killed, and said so.
    held = node(seen.stop_task, STOP_HELD)
    if (held.get("state"), _code(held), len(runs(STOP_HELD))) != ("failed", "device_stopped", 1):
        v.add("stop: the running command did not end device_stopped", [where(seen.stop_task, STOP_HELD)])
    v.add("a stopped or cancelled command lives on", seen.still_running)
    v.add("a stopped or cancelled command ran to its end", seen.finished)
    # While stopped (from the stop's request to the resume's) the device started nothing; the
    # node waiting for it (its edge from the stopped one is `always`) ran once, after the resume.
    stop_at, resume_at = seen.sent.get("stop", 0.0), seen.sent.get("resume", 0.0)
    window_end = resume_at or float("inf")
    during = [
        f"{e.path.name}: {e.at - stop_at:.2f}s after the stop"
        for xs in seen.executions.values()
        for e in xs
        if e.device_id == seen.stopped_device_id and stop_at < e.at < window_end
    ]
    v.add("stop: the device started work while stopped", during)
    after = node(seen.stop_task, STOP_AFTER)
    if after.get("state") != "succeeded" or len(runs(STOP_AFTER)) != 1 or not runs(STOP_AFTER)[0].at > resume_at > 0:
        v.add("stop: the device did not run work again, once, after the resume", [where(seen.stop_task, STOP_AFTER)])
    device = seen.stopped_device
    applied, wanted = device.get("control_applied"), device.get("control_generation")
    if device.get("admin_state") != "active" or applied != wanted:
        v.add(
            "stop: the device did not end active with its agent at the controls' generation",
            [f"admin_state {device.get('admin_state')!r}, control {applied} applied of {wanted}"],
        )

    # The cancel: its task ended cancelled and nothing of it ran after the request.
    if seen.cancel_task.get("state") != "cancelled":
        v.add("cancel: the task did not end cancelled", [f"task state {seen.cancel_task.get('state')!r}"])
    cancel_at = seen.sent.get("cancel", 0.0)
    late = [
        f"{e.path.name}: {e.at - cancel_at:.2f}s after the cancel"
        for e in (*runs(CANCEL_HELD), *runs(CANCEL_THEN))
        if e.at >= cancel_at
    ]
    v.add("cancel: something of the task ran after the cancel", late)
    if len(runs(CANCEL_HELD)) != 1 or runs(CANCEL_THEN):
        v.add(
            "cancel: the held command ran other than once, or what follows it ran",
            [where(seen.cancel_task, CANCEL_HELD), where(seen.cancel_task, CANCEL_THEN)],
        )

    # The approval: the store holds the decision given, and the command ran as that decision says.
    approved = seen.decision == "approved"
    if seen.approval.get("state") != seen.decision:
        v.add(
            "approval: the stored state is not the decision given",
            [
                f"stored {seen.approval.get('state')!r} (requested {seen.approval.get('requested_state')!r}), "
                f"decided {seen.decision!r}"
            ],
        )
    asked = node(seen.ask_task, ASKED)
    if len(runs(ASKED)) != (1 if approved else 0):
        v.add(f"approval: the command ran other than {'once' if approved else 'never'}", [where(seen.ask_task, ASKED)])
    outcome = ("succeeded", "") if approved else ("failed", "approval_denied")
    if (asked.get("state"), _code(asked)) != outcome:
        v.add(f"approval: the node did not end {' '.join(outcome).strip()}", [where(seen.ask_task, ASKED)])

    # The API: an outage's answers, then the control's own (a decision asked again after a lost
    # answer may find it decided already: 409, which the stored state then has to bear out).
    for control, answers in seen.answers.items():
        final = FINAL[control]
        *before, last = answers or [Answer(0, error="never asked")]
        ok = last.status in final and all(a.status in seen.outage for a in before)
        if control in ("approve", "deny"):
            if last.status == 409:
                ok = bool(before) and all(a.status in seen.outage for a in before)
            elif last.status == 200:
                ok = ok and last.body.get("state") == seen.decision
            elif last.status == 202:
                ok = ok and last.body.get("requested_state") == seen.decision
        if not ok:
            shown = ", ".join(str(a) for a in answers[-SHOW:])
            v.add(f"the API did not answer the {control} as it must", [f"{len(answers)} answer(s): ... {shown}"])
    return v
