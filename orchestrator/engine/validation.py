"""Checking a DAG against the fleet: structure first, then that every tool node fits a device and
that its arguments fit the tool's input schema there (SPEC section 3, validation at submission)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from orchestrator.domain import checks, dag, fanout, placement, verification
from orchestrator.domain.model import AdminState, DagSpec, NodeKind
from orchestrator.domain.problems import Problem
from orchestrator.engine.records import DeviceRun


def known_tools(devices: Iterable[DeviceRun]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for dev in devices:
        if dev.admin is not AdminState.REVOKED:
            out.update(dev.tools)
    return out


def catalogued(devices: Iterable[DeviceRun], policies: Mapping[str, Any] | None = None) -> list[checks.CatalogDevice]:
    """The devices as the submission checks see them; `policies` maps device id to `info.policy`."""
    policies = policies or {}
    out = []
    for d in devices:
        policy = policies.get(d.id)
        out.append(checks.CatalogDevice(d.view(), d.tools, policy if isinstance(policy, Mapping) else None))
    return out


# A node's own problems that its fleet checks depend on: its tools must exist, and its arguments
# must be within the size limit before they are judged against a schema.
_HOLDS_NODE = frozenset({"unknown_tool", "limit_exceeded"})


def validate_against(
    spec: DagSpec, devices: list[DeviceRun], limits: dag.Limits, policies: Mapping[str, Any] | None = None
) -> list[Problem]:
    """SPEC section 3, validation at submission: unique ids, edges, no cycles, references to
    ancestors, known tools (with the nearest names), sizes; then a capable device for each node,
    and arguments that fit the input schema of each tool on one of the node's capable devices.
    Every independent problem is reported at once; a node's fleet checks are left out only when
    its own structural problems make them moot.
    `policies` (device id to reported `info.policy`) lets the checks see what a device asks
    approval for."""
    problems = dag.validate(spec, known_tools(devices), limits)
    if len(spec.nodes) > limits.max_nodes:
        return problems  # too big to judge node by node against the fleet
    # All in one round: a node's fleet checks wait only on its own problems (a tool no device
    # offers makes "no capable device" and argument checks moot), not on other nodes' or edges'.
    held = {p.extra.get("node") for p in problems if p.code in _HOLDS_NODE}
    if held:
        kept = [n for n in spec.nodes if n.id not in held]
        if not kept:
            return problems
        spec = spec.model_copy(update={"nodes": kept})
    fleet = checks.Catalog(catalogued(devices, policies))
    views = [d.view for d in fleet.devices]
    runnable: dict[Hashable, bool] = {}  # by placement signature: alike nodes fit alike devices
    for node in spec.nodes:
        if node.kind is NodeKind.TOOL:
            key = placement.signature(node)
            if key not in runnable:
                runnable[key] = placement.could_ever_run(node, views)
            if not runnable[key]:
                problems.append(placement.no_capable_device(node, views))
    problems += fanout.fan_out_problems(spec, fleet) + verification.verify_problems(spec, fleet)
    problems += verification.verify_approval_problems(spec, fleet)
    return problems + checks.argument_problems(spec, fleet)


def warnings_against(spec: DagSpec, devices: list[DeviceRun]) -> list[checks.SubmissionWarning]:
    return checks.retry_warnings(spec, catalogued(devices))


def dry_run(spec: DagSpec, devices: list[DeviceRun], limits: dag.Limits, policies: Mapping[str, Any]) -> dict[str, Any]:
    """What submitting `spec` would do, without doing it: the body of `POST /v1/tasks?dry_run=true`."""
    problems = validate_against(spec, devices, limits, policies)
    fleet = checks.Catalog(catalogued(devices, policies))
    views = [d.view for d in fleet.devices]
    chosen_by: dict[Hashable, placement.DeviceView | None] = {}
    nodes = []
    for node in spec.nodes:
        able = fleet.candidates(node)
        key = placement.signature(node)
        if key not in chosen_by:
            chosen_by[key] = placement.choose_queue(node, views)
        chosen = chosen_by[key]
        row: dict[str, Any] = {
            "id": node.id,
            "devices": sorted(d.name for d in able),
            "would_run_on": (chosen.name or chosen.id) if chosen is not None else None,
            "refusals": [r for d in sorted(able, key=lambda d: d.name) for r in checks.refusals(node, d)],
        }
        if node.for_each is not None:
            found, left = fanout.targets(node, views)
            row.update(would_run_on=None, fans_out_to=[t.name for t in found], left_out=left)
        nodes.append(row)
    return {
        "valid": not problems,
        "problems": [problem_out(p) for p in problems],
        "warnings": [w.as_dict() for w in checks.retry_warnings(spec, fleet)],
        "nodes": nodes,
    }


def problem_out(problem: Problem) -> dict[str, Any]:
    """A problem as the dry run lists it: `node_id` set whenever the problem is about one node."""
    out = problem.as_dict()
    node = problem.extra.get("node_id", problem.extra.get("node"))
    if isinstance(node, str):
        out["node_id"] = node
    return out
