"""`${nodes.<id>.output...}` references in command arguments (SPEC section 2, Node fields).

A string that is exactly one reference takes the referenced value with its type; a reference
inside a longer string is replaced by the value's text (JSON for objects and lists).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

_REF = re.compile(
    r"\$\{nodes\.(?P<node>[A-Za-z0-9][A-Za-z0-9_-]*)\."
    r"(?P<root>output|results\[(?P<index>\d+)\]\.result)"
    r"(?P<path>(?:\.[A-Za-z0-9_-]+|\[\d+\])*)\}"
)
_LOOSE = re.compile(r"\$\{nodes\.[^}]*\}")
_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]")


class TemplateError(ValueError):
    """A reference that cannot be resolved (at run time: node fails with `template_error`)."""


def references(value: Any) -> set[str]:
    """Node ids referenced anywhere inside `value` (strings nested in dicts and lists)."""
    found: set[str] = set()
    for text in _strings(value):
        found.update(m.group("node") for m in _REF.finditer(text))
    return found


def malformed(value: Any) -> list[str]:
    """`${nodes...}` snippets that look like references but do not parse."""
    bad = []
    for text in _strings(value):
        for m in _LOOSE.finditer(text):
            if not _REF.fullmatch(m.group(0)):
                bad.append(m.group(0))
    return bad


Lookup = Callable[[str], Mapping[str, Any] | None]


def resolve(value: Any, lookup: Lookup) -> Any:
    """Replace every reference in `value`. `lookup(node_id)` gives `{"output", "results"}`
    of a finished node, or None when the node has none (then `TemplateError`)."""
    if isinstance(value, str):
        return _resolve_string(value, lookup)
    if isinstance(value, list):
        return [resolve(v, lookup) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, lookup) for k, v in value.items()}
    return value


def _resolve_string(text: str, lookup: Lookup) -> Any:
    whole = _REF.fullmatch(text)
    if whole:
        return _value(whole, lookup)
    if "${nodes." not in text:
        return text

    def _sub(m: re.Match[str]) -> str:
        v = _value(m, lookup)
        return v if isinstance(v, str) else json.dumps(v)

    return _REF.sub(_sub, text)


def _value(m: re.Match[str], lookup: Lookup) -> Any:
    node = m.group("node")
    outcome = lookup(node)
    if outcome is None:
        raise TemplateError(f"{m.group(0)}: node '{node}' has not produced an output")
    if m.group("index") is not None:
        index = int(m.group("index"))
        results = outcome.get("results") or []
        if index >= len(results):
            raise TemplateError(
                f"{m.group(0)}: node '{node}' has {len(results)} results, index {index} is out of range"
            )
        current: Any = results[index].get("result")
    else:
        current = outcome.get("output")
    for step in _STEP.finditer(m.group("path")):
        key, idx = step.group(1), step.group(2)
        if key is not None and isinstance(current, dict) and key in current:
            current = current[key]
        elif idx is not None and isinstance(current, list) and int(idx) < len(current):
            current = current[int(idx)]
        else:
            raise TemplateError(f"{m.group(0)}: '{step.group(0)}' does not exist in the value of node '{node}'")
    return current


def _strings(value: Any) -> list[str]:
    out: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return out
