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
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUNS_DIR = "runs"
TERMINAL = ("succeeded", "failed", "skipped", "cancelled")
RAN = ("succeeded", "failed")
SHOW = 12  # offending nodes listed per invariant


@dataclass(frozen=True)
class Execution:
    """One run of a node's command, as found on a device's disk."""

    node: str
    device_id: str
    path: Path


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
