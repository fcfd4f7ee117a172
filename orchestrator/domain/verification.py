"""Verify commands at submission: they must be read-only wherever the node may run,
because they run again whenever an outcome must be decided (after a restart, on another device)."""

from __future__ import annotations

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
