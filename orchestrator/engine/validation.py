"""Checking a DAG against the fleet: structure first, then that every tool node fits a device."""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.domain import dag, placement
from orchestrator.domain.model import AdminState, DagSpec, NodeKind
from orchestrator.domain.problems import Problem
from orchestrator.engine.records import DeviceRun


def known_tools(devices: Iterable[DeviceRun]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for dev in devices:
        if dev.admin is not AdminState.REVOKED:
            out.update(dev.tools)
    return out


def validate_against(spec: DagSpec, devices: list[DeviceRun], limits: dag.Limits) -> list[Problem]:
    """SPEC section 3, validation at submission: unique ids, edges, no cycles, references to
    ancestors, known tools (with the nearest names), sizes; then a capable device for each node."""
    problems = dag.validate(spec, known_tools(devices), limits)
    if problems:
        return problems
    views = [d.view() for d in devices]
    return [
        placement.no_capable_device(node, views)
        for node in spec.nodes
        if node.kind is NodeKind.TOOL and not placement.could_ever_run(node, views)
    ]
