"""Command-line values that the agent's CLI and the orchestrator's parse the same way."""

from __future__ import annotations

import typer


def parse_labels(values: list[str] | None) -> dict[str, str] | None:
    """`--label KEY=VALUE` (repeatable) as a dict; None when none is given."""
    if not values:
        return None
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"labels are KEY=VALUE, got '{item}'")
        out[key] = value
    return out
