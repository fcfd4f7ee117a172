"""Fan-out nodes: a node with `for_each` runs once on every matching device.

When the node becomes ready, `targets` picks its devices from the fleet as it is then: the ones
its selector matches (labels and platform, or the names it lists) that are in service and have
its tools, in rollout order (a `devices` list in its order, otherwise by name). Each gets a child:
a copy of the node pinned to that device (`child_spec`), which the engine places, runs, retries
and recovers like any other node. A `Rollout` releases the children in order (the canaries
first, at most `max_parallel` at once), halts when a canary fails or the failure budget is spent,
and says how the node ends once every child has. Pure: no devices are looked up here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from orchestrator.domain import placement, templates
from orchestrator.domain.checks import Catalog, CatalogDevice, catalog
from orchestrator.domain.model import AdminState, DagSpec, Liveness, NodeKind, NodeSpec, NodeState, Placement
from orchestrator.domain.placement import DeviceView
from orchestrator.domain.problems import Problem

UNIT_MARK = "@"  # not in a node id (a slug): `web@dev_1f3c` is node web's child on dev_1f3c
LEFT_OUT_SHOWN = 100  # devices listed in `left_out` (the rest are counted)
ACTIVE = frozenset(
    {NodeState.READY, NodeState.QUEUED, NodeState.RUNNING, NodeState.WAITING_APPROVAL, NodeState.TAKEN_OVER}
    | {NodeState.VERIFYING}
)


class Halt(StrEnum):
    """Why a rollout stopped releasing children (also the node's error code)."""

    CANARY_FAILED = "canary_failed"
    BUDGET_SPENT = "failure_budget_exhausted"


NO_MATCHING_DEVICE = "no_matching_device"
FAN_OUT_FAILED = "fan_out_failed"
HALTED = "fan_out_halted"  # the error of a child skipped because its rollout halted


def child_unit(node_id: str, device_id: str) -> str:
    """The engine's name for node `node_id`'s child on `device_id`."""
    return f"{node_id}{UNIT_MARK}{device_id}"


def split_unit(unit: str) -> tuple[str, str | None]:
    """(node id, device id of the child) of a unit; (node id, None) for a node of the DAG."""
    node_id, mark, device_id = unit.partition(UNIT_MARK)
    return (node_id, device_id) if mark else (unit, None)


def child_spec(parent: NodeSpec, device_id: str) -> NodeSpec:
    """The node as its child on one device runs it: pinned there, no longer fanning out."""
    return parent.model_copy(update={"placement": Placement(device=device_id), "for_each": None})


@dataclass(frozen=True)
class Target:
    device_id: str
    name: str


def targets(spec: NodeSpec, devices: Iterable[DeviceView]) -> tuple[list[Target], list[dict[str, str]]]:
    """The devices the fan-out node `spec` runs on now, in rollout order, and those it names or
    whose labels it matches but leaves out, each with the reason (not in service: cordoned,
    draining, stopped; revoked or unknown; lacking a tool). Offline devices are targets: their
    children wait for them like any node pinned to a device (up to its queue_timeout_s)."""
    fan = spec.for_each
    assert fan is not None, "only a fan-out node has targets"
    fleet = [d for d in devices if d.admin is not AdminState.REVOKED]
    out: list[Target] = []
    left: list[dict[str, str]] = []
    if fan.devices is not None:
        by_id = {d.id: d for d in fleet}
        by_name = {d.name: d for d in fleet}
        chosen: list[DeviceView] = []
        for name in fan.devices:
            found = by_id.get(name) or by_name.get(name)
            if found is None:
                left.append({"device": name, "reason": "no such device now (revoked, renamed or never enrolled)"})
            elif found not in chosen:
                chosen.append(found)
    else:
        selector = _untooled(spec)
        chosen = sorted((d for d in fleet if placement.capable(selector, d)), key=lambda d: (d.name, d.id))
    for d in chosen:
        why = _unfit(spec, d)
        if why:
            left.append({"device": d.name or d.id, "reason": why})
        else:
            out.append(Target(d.id, d.name or d.id))
    return out, left


def _untooled(spec: NodeSpec) -> NodeSpec:
    """The node's selector alone (labels, platform, names): which devices it means, tools aside."""
    return spec.model_copy(update={"commands": [], "verify": [], "kind": NodeKind.TOOL})


def _unfit(spec: NodeSpec, device: DeviceView) -> str:
    if device.admin is not AdminState.ACTIVE:
        return f"it was {device.admin.value} when the node became ready"
    if device.liveness is Liveness.ENROLLED and not device.tools:
        return "it has never connected, so its tools are not known"
    if not placement.capable(spec, device):
        why = placement.refusals(spec, device)
        return "it has " + ", ".join(why) if why else "it cannot run the node"
    return ""


@dataclass
class Rollout:
    """The children of one fan-out node and the rules that release them. The counters follow the
    children's states (`note`), so each decision costs the same however many children there are;
    `recount` rebuilds them from states after a restart."""

    node_id: str
    units: list[str]  # child units in rollout order
    names: dict[str, str]  # unit -> device name (the output map's keys)
    canary: int = 0
    max_parallel: int | None = None
    budget: int | None = None
    left_out: list[dict[str, str]] = field(default_factory=list)
    released: int = 0  # children that have left PENDING: always a prefix of `units`
    stopped: bool = False  # the halt has been applied (waiting children skipped)
    active: int = 0
    finished: int = 0
    failed: int = 0
    succeeded: int = 0
    canary_ok: int = 0
    canary_bad: int = 0
    _index: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._index = {u: i for i, u in enumerate(self.units)}
        self.canary = min(self.canary, len(self.units))

    @classmethod
    def of(cls, spec: NodeSpec, found: list[Target], left_out: list[dict[str, str]]) -> Rollout:
        fan = spec.for_each
        assert fan is not None
        units = [child_unit(spec.id, t.device_id) for t in found]
        return cls(
            spec.id,
            units,
            {child_unit(spec.id, t.device_id): t.name for t in found},
            canary=fan.canary,
            max_parallel=fan.max_parallel,
            budget=fan.failure_budget,
            left_out=left_out[:LEFT_OUT_SHOWN],
        )

    def note(self, unit: str, old: NodeState, new: NodeState) -> None:
        """Child `unit` went from `old` to `new`."""
        self.active += int(new in ACTIVE) - int(old in ACTIVE)
        self.finished += int(new.terminal) - int(old.terminal)
        self.failed += int(new is NodeState.FAILED) - int(old is NodeState.FAILED)
        self.succeeded += int(new is NodeState.SUCCEEDED) - int(old is NodeState.SUCCEEDED)
        if self._index.get(unit, self.canary) < self.canary:
            self.canary_ok += int(new is NodeState.SUCCEEDED) - int(old is NodeState.SUCCEEDED)
            self.canary_bad += int(new is NodeState.FAILED) - int(old is NodeState.FAILED)

    def recount(self, states: Mapping[str, NodeState]) -> None:
        self.active = self.finished = self.failed = self.succeeded = self.canary_ok = self.canary_bad = 0
        for unit in self.units:
            self.note(unit, NodeState.PENDING, states[unit])
        self.released = next((i for i, u in enumerate(self.units) if states[u] is NodeState.PENDING), len(self.units))
        self.stopped = self.halt() is not None and not any(
            states[u] in (NodeState.PENDING, NodeState.READY, NodeState.QUEUED) for u in self.units
        )

    def halt(self) -> Halt | None:
        """Why no more children may start: a canary failed, or K children failed (budget K)."""
        if self.canary_bad:
            return Halt.CANARY_FAILED
        if self.budget is not None and self.failed >= self.budget:
            return Halt.BUDGET_SPENT
        return None

    def release(self) -> list[str]:
        """Children that may start now (to be made READY), in rollout order: only the canaries
        until every one of them succeeded, and never more than `max_parallel` running at once."""
        if self.halt() is not None:
            return []
        end = self.canary if self.canary and self.canary_ok < self.canary else len(self.units)
        if self.max_parallel is not None:
            end = min(end, self.released + max(0, self.max_parallel - self.active))
        if end <= self.released:
            return []
        out = self.units[self.released : end]
        self.released = end
        return out

    @property
    def done(self) -> bool:
        return self.finished == len(self.units)

    def verdict(self) -> str | None:
        """The node's error code once every child ended, or None: it succeeded. Without a budget
        any failed child fails the node; with budget K, fewer than K failures are tolerated, as
        long as some child succeeded (a rollout that succeeded nowhere did not succeed)."""
        halted = self.halt()
        if halted is not None:
            return halted.value
        if self.failed and (self.budget is None or not self.succeeded):
            return FAN_OUT_FAILED
        return None

    def failure_message(self, code: str, failed: list[tuple[str, str]]) -> str:
        """Why the node failed: its failed children (device, error code; the first 5) and the rule."""
        named = ", ".join(f"{name} ({error})" for name, error in failed[:5])
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        why = self.halt_message(code) if code != FAN_OUT_FAILED else self.failed_message()
        return f"{len(failed)} of {len(self.units)} children failed: {named}{more}; {why}"

    def halt_message(self, code: str) -> str:
        if code == Halt.CANARY_FAILED:
            return f"a canary failed (the first {self.canary} devices run first), so the rest were not started"
        return f"{self.failed} children failed, reaching failure_budget {self.budget}, so the rest were not started"

    def failed_message(self) -> str:
        if self.budget is None:
            return "without a failure_budget every child must succeed"
        return "no child succeeded"

    def fan_out_row(self) -> dict[str, Any]:
        """What the node's row keeps of its rollout (the children have rows of their own)."""
        return {"devices": len(self.units), "left_out": self.left_out}


# ---------------------------------------------------------------- at submission


def fan_out_problems(spec: DagSpec, devices: Sequence[CatalogDevice] | Catalog) -> list[Problem]:
    """Each device a `for_each.devices` list names must be enrolled and able to run the node, and a
    reference into such a node's output must start with one of their names (the map's keys)."""
    fleet = catalog(devices)
    active = [d for d in fleet.devices if d.view.admin is not AdminState.REVOKED]
    by_key = {d.view.id: d for d in active} | {d.view.name: d for d in active if d.view.name}
    problems: list[Problem] = []
    names: dict[str, set[str]] = {}
    for node in spec.nodes:
        fan = node.for_each
        if fan is None or fan.devices is None:
            continue
        names[node.id] = set()
        for entry in fan.devices:
            found = by_key.get(entry)
            if found is None:
                nearest = difflib.get_close_matches(entry, [d.name for d in active], n=3, cutoff=0.6)
                hint = f"; did you mean {', '.join(nearest)}?" if nearest else "; enroll it first"
                problems.append(
                    Problem(
                        "unknown_device",
                        f"node '{node.id}' for_each.devices names '{entry}', which is not an enrolled device{hint}",
                        {"node": node.id, "node_id": node.id, "device": entry, "nearest": nearest},
                    )
                )
                continue
            names[node.id].add(found.name)
            if not placement.capable(node, found.view):
                why = ", ".join(placement.refusals(node, found.view))
                problems.append(
                    Problem(
                        "no_capable_device",
                        f"node '{node.id}' for_each.devices names '{entry}', which cannot run it ({why}); "
                        "leave it out or give it the tools",
                        {"node": node.id, "node_id": node.id, "device": entry},
                    )
                )
    for node in spec.nodes:
        args = [c.arguments for c in [*node.commands, *node.verify]]
        for ref, root, steps, text in templates.parts(args):
            if ref not in names or root is None or not steps or templates.first_key(steps, names[ref])[0]:
                continue
            problems.append(
                Problem(
                    "invalid_reference",
                    f"node '{node.id}': {text} looks up a device that node '{ref}' does not run on; its output "
                    f"has one key per device it names: {', '.join(sorted(names[ref]))}",
                    {"node": node.id, "node_id": node.id, "reference": ref},
                )
            )
    return problems
