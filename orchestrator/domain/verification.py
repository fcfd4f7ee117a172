"""Verify commands at submission: they must be read-only wherever the node may run, and must not
wait for a person, because they run again whenever an outcome must be decided (after a restart,
on another device)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.domain.checks import Catalog, CatalogDevice, catalog
from orchestrator.domain.model import DagSpec
from orchestrator.domain.problems import Problem

# Arguments that make a call to a read-only tool write a file (the device agent treats such a
# call as a write too, device_agent.policy.WRITE_ARGUMENTS): a browser tool given `filename`
# saves its output into the device's workspace.
WRITE_ARGUMENTS: dict[str, tuple[str, ...]] = {"browser": ("filename",)}


def writes_file(tool: str, arguments: Mapping[str, Any]) -> bool:
    names = WRITE_ARGUMENTS.get(tool.partition(".")[0], ())
    return any(arguments.get(name) not in (None, "") for name in names)


def verify_problems(spec: DagSpec, devices: Sequence[CatalogDevice] | Catalog) -> list[Problem]:
    """`verify_not_read_only`: a verify command's tool is not annotated read-only on a device the
    node may run on. Verify commands run again whenever an outcome needs deciding (after a
    restart, on another device), so they must not change anything."""
    fleet = catalog(devices)
    problems: list[Problem] = []
    for node in spec.nodes:
        for index, command in enumerate(node.verify):
            writes = writes_file(command.tool, command.arguments)
            writers = sorted(
                d.name
                for d in fleet.candidates(node)
                if command.tool in d.tools
                and (writes or not bool((d.tools[command.tool].get("annotations") or {}).get("read_only")))
            )
            if writers:
                shown = ", ".join(writers[:5]) + (f" and {len(writers) - 5} more" if len(writers) > 5 else "")
                problems.append(
                    Problem(
                        "verify_not_read_only",
                        f"node '{node.id}' verify command {index} uses {command.tool}"
                        + (
                            " with an output file argument (filename), which writes a file on "
                            if writes
                            else ", which is not read-only on "
                        )
                        + f"{shown}; verify commands may only use read-only tools (such as files.read, files.list, "
                        "system.info) without output files, because they run again whenever an outcome must be "
                        "decided",
                        {
                            "node": node.id,
                            "node_id": node.id,
                            "verify": index,
                            "tool": command.tool,
                            "devices": writers,
                        },
                    )
                )
    return problems


APPROVAL_TOOL = "approval.request"  # always waits for a person (device_agent/approvals.py)


def verify_approval_problems(spec: DagSpec, devices: Sequence[CatalogDevice] | Catalog) -> list[Problem]:
    """`verify_needs_approval`: a verify command's tool waits for a person: `approval.request`
    always, and a tool on a candidate device's reported `approval_required` list (unless that
    agent runs unattended). Verify commands decide an outcome unattended, after a restart or on
    another device, so none of them may wait on someone."""
    fleet = catalog(devices)
    problems: list[Problem] = []
    for node in spec.nodes:
        for index, command in enumerate(node.verify):
            asking = (
                []
                if command.tool == APPROVAL_TOOL
                else sorted(d.name for d in fleet.candidates(node) if _asks_first(d, command.tool))
            )
            if command.tool != APPROVAL_TOOL and not asking:
                continue
            where = "always waits" if not asking else f"waits for approval on {', '.join(asking[:5])}"
            if len(asking) > 5:
                where += f" and {len(asking) - 5} more"
            problems.append(
                Problem(
                    "verify_needs_approval",
                    f"node '{node.id}' verify command {index} uses {command.tool}, which {where} for a person's "
                    "decision; verify commands run unattended whenever an outcome must be decided, so use a "
                    "read-only tool that answers by itself (such as files.read or system.info), and ask for "
                    "approval in the node's commands instead",
                    {"node": node.id, "node_id": node.id, "verify": index, "tool": command.tool, "devices": asking},
                )
            )
    return problems


def _asks_first(device: CatalogDevice, tool: str) -> bool:
    """Whether the device's reported policy makes `tool` wait for approval (as its agent's
    router decides: fnmatch patterns, none when unattended); unknown policy: no."""
    policy = device.policy
    if tool not in device.tools or not isinstance(policy, Mapping) or policy.get("unattended"):
        return False
    patterns = policy.get("approval_required")
    if not isinstance(patterns, list):
        return False
    return any(isinstance(p, str) and fnmatch.fnmatchcase(tool, p) for p in patterns)
