"""Verify commands at submission: they must be read-only wherever the node may run,
because they run again whenever an outcome must be decided (after a restart, on another device)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.domain.checks import Catalog, CatalogDevice, catalog
from orchestrator.domain.model import DagSpec
from orchestrator.domain.problems import Problem


def verify_problems(spec: DagSpec, devices: Sequence[CatalogDevice] | Catalog) -> list[Problem]:
    """`verify_not_read_only`: a verify command's tool is not annotated read-only on a device the
    node may run on. Verify commands run again whenever an outcome needs deciding (after a
    restart, on another device), so they must not change anything."""
    fleet = catalog(devices)
    problems: list[Problem] = []
    for node in spec.nodes:
        for index, command in enumerate(node.verify):
            writers = sorted(
                d.name
                for d in fleet.candidates(node)
                if command.tool in d.tools
                and not bool((d.tools[command.tool].get("annotations") or {}).get("read_only"))
            )
            if writers:
                shown = ", ".join(writers[:5]) + (f" and {len(writers) - 5} more" if len(writers) > 5 else "")
                problems.append(
                    Problem(
                        "verify_not_read_only",
                        f"node '{node.id}' verify command {index} uses {command.tool}, which is not read-only on "
                        f"{shown}; verify commands may only use read-only tools (such as files.read, files.list, "
                        "system.info), because they run again whenever an outcome must be decided",
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
