"""The tool section and device inventory a model is shown, generated from MCP catalogues and kept
within a token budget."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from orchestrator.planner.prompts import render

CHARS_PER_TOKEN = 4  # a rough, conservative estimate for English text and JSON


def estimate_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN + 1


def tool_entries(tools: Iterable[dict[str, Any]], detail: int = 2) -> list[dict[str, Any]]:
    """Tool specs (SPEC section 2, Tool) as template entries. `detail` 2: everything; 1: short
    descriptions, no parameter descriptions; 0: names and required parameters only."""
    out = []
    for t in sorted(tools, key=lambda t: t["name"]):
        schema = t.get("input_schema") or {}
        props: dict[str, Any] = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        params = []
        for name, prop in props.items():
            if detail == 0 and name not in required:
                continue
            params.append(
                {
                    "name": name,
                    "type": _type_of(prop),
                    "required": name in required,
                    "default": prop.get("default"),
                    "description": (prop.get("description") or "")[:160] if detail == 2 else "",
                }
            )
        description = " ".join((t.get("description") or "").split())
        if detail < 2:
            description = description[:120]
        out.append(
            {
                "name": t["name"],
                "description": description or "(no description)",
                "read_only": bool((t.get("annotations") or {}).get("read_only")),
                "params": params,
                "example": {p["name"]: _example(props[p["name"]]) for p in params if p["required"]},
            }
        )
    return out


def tool_section(tools: Iterable[dict[str, Any]], detail: int = 2) -> str:
    return render("tools.j2", tools=tool_entries(tools, detail))


def inventory(devices: list[dict[str, Any]], token_budget: int) -> str:
    """Devices with their tools, trimmed to fit: fewer details first, then fewer devices."""
    usable = sorted(devices, key=lambda d: (d["state"] not in ("idle", "busy"), d["name"]))
    for detail in (2, 1, 0):
        for count in range(len(usable), 0, -1):
            text = _render_inventory(usable[:count], detail, len(usable) - count)
            if estimate_tokens(text) <= token_budget:
                return text
            if count > 8 and detail > 0:
                break  # try less detail before dropping devices
    return _render_inventory(usable[:1], 0, len(usable) - 1)


def _render_inventory(devices: list[dict[str, Any]], detail: int, dropped: int) -> str:
    # Devices with the same tools share one tool section, which keeps big fleets small.
    groups: dict[str, list[dict[str, Any]]] = {}
    tools_of: dict[str, list[dict[str, Any]]] = {}
    for d in devices:
        key = json.dumps(sorted(t["name"] for t in d["tools"]))
        groups.setdefault(key, []).append(d)
        tools_of[key] = d["tools"]
    parts = []
    for i, (key, members) in enumerate(groups.items(), start=1):
        parts.append(f"Device group {i}:")
        for d in members:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(d["labels"].items())) or "none"
            parts.append(
                f"- id {d['id']}, name {d['name']}, platform {d['platform']}, state {d['state']}, labels {labels}"
            )
        parts.append(f"Tools of group {i}:")
        parts.append(tool_section(tools_of[key], detail))
    if dropped:
        parts.append(f"({dropped} more devices not shown to save space)")
    return "\n".join(parts) if parts else "(no devices are connected)"


def _type_of(prop: dict[str, Any]) -> str:
    if "type" in prop:
        t = prop["type"]
        if t == "array" and isinstance(prop.get("items"), dict):
            return f"array of {_type_of(prop['items'])}"
        return str(t) if not isinstance(t, list) else " or ".join(map(str, t))
    if "anyOf" in prop:
        return " or ".join(_type_of(p) for p in prop["anyOf"] if isinstance(p, dict))
    if "enum" in prop:
        return "one of " + ", ".join(json.dumps(v) for v in prop["enum"])
    return "any"


def _example(prop: dict[str, Any]) -> Any:
    if "default" in prop:
        return prop["default"]
    if prop.get("enum"):
        return prop["enum"][0]
    t = prop.get("type")
    if t == "array":
        items = prop.get("items") if isinstance(prop.get("items"), dict) else {}
        return [_example(items or {"type": "string"})]
    return {"string": "...", "integer": 1, "number": 1.0, "boolean": True, "object": {}}.get(str(t), "...")
