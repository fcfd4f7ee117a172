"""`${nodes.<id>.output...}` references in command arguments (SPEC section 2, Node fields).

A string that is exactly one reference takes the referenced value with its type; a reference
inside a longer string is replaced by the value's text (JSON for objects and lists).

A path step is `.key`, `[index]` or `["key"]` (any key without `"`, `\\`, `]` or `}`). A fan-out
node's output is a map by device name, and names may hold `.` (`web-1.example.com`): where `.a`
is not a key of the object, the steps that follow are joined to it (`.a.b`, then `.a.b.c`) until
one is, so `${nodes.x.output.web-1.example.com.stdout}` works as `["web-1.example.com"].stdout`.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

_REF = re.compile(
    r"\$\{nodes\.(?P<node>[A-Za-z0-9][A-Za-z0-9_-]*)\."
    r"(?P<root>output|results\[(?P<index>\d+)\]\.result)"
    r"(?P<path>(?:\.[A-Za-z0-9_-]+|\[\d+\]|\[\"[^\"\\\]}]+\"\])*)\}"
)
_LOOSE = re.compile(r"\$\{nodes\.[^}]*\}")
# `${<word>.<anything>}` where the word may be a misspelt `nodes` (`${node.a.output}`). `${` with
# no dot after a word (`${HOME}`, `${1}`) is shell text and passes through; so does a word not
# like `nodes` (`${foo.bar}`), which no shell expands either.
_NEAR = re.compile(r"\$\{\s*(?P<head>[A-Za-z_][A-Za-z0-9_]*)\s*\.(?P<rest>[^}]*)\}")
_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\"([^\"\\\]}]+)\"\]")


class TemplateError(ValueError):
    """A reference that cannot be resolved (at run time: node fails with `template_error`)."""


def references(value: Any) -> set[str]:
    """Node ids referenced anywhere inside `value` (strings nested in dicts and lists)."""
    found: set[str] = set()
    for text in _strings(value):
        found.update(m.group("node") for m in _REF.finditer(text))
    return found


def parts(value: Any) -> list[tuple[str, str | None, list[Step], str]]:
    """Every reference inside `value`: (node, root, steps, text); root is "output" or, for
    `results[<i>].result`, None."""
    out = []
    for text in _strings(value):
        for m in _REF.finditer(text):
            root = "output" if m.group("index") is None else None
            out.append((m.group("node"), root, parse_path(m.group("path")), m.group(0)))
    return out


def whole_output(value: Any, node_ids: Collection[str]) -> str | None:
    """The node whose entire output `value` is (a string that is exactly `${nodes.<id>.output}`
    for one of `node_ids`), or None."""
    if not isinstance(value, str):
        return None
    m = _REF.fullmatch(value)
    if m is None or m.group("index") is not None or m.group("path") or m.group("node") not in node_ids:
        return None
    return m.group("node")


def malformed(value: Any) -> list[str]:
    """`${nodes...}` snippets that look like references but do not parse, and `${<word>....}`
    where the word is a misspelt `nodes` (`${node.a.output}`, `${Nodes.a.output}`)."""
    bad = []
    for text in _strings(value):
        for m in _LOOSE.finditer(text):
            if not _REF.fullmatch(m.group(0)):
                bad.append(m.group(0))
        for m in _NEAR.finditer(text):
            if m.group("head") != "nodes" and _like(m.group("head"), "nodes"):
                bad.append(m.group(0))
    return bad


def suggestion(bad: str) -> str | None:
    """A valid reference that `bad` (one of `malformed`'s) was probably meant to be, or None."""
    m = _NEAR.fullmatch(bad)
    if m is None:
        return None
    node, _, tail = m.group("rest").strip().partition(".")
    root, sep, path = tail.partition(".")
    step, bracket, index = root.partition("[")
    if _like(step, "output"):
        root = "output" + bracket + index
    elif _like(step, "results"):
        root = "results" + bracket + index
    fixed = "${nodes." + node + "." + root + sep + path + "}"
    if _REF.fullmatch(fixed) is None and not tail:  # `${node.a}`: the whole output was probably meant
        fixed = "${nodes." + node + ".output}"
    return fixed if _REF.fullmatch(fixed) and fixed != bad else None


def _like(word: str, meant: str) -> bool:
    """`word` is `meant` with a typo: another case, a letter missing, added, swapped or wrong."""
    return difflib.SequenceMatcher(None, word.lower(), meant).ratio() >= 0.75


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
    return _walk(current, parse_path(m.group("path")), m.group(0), node)


Step = tuple[str, int | None, bool]  # (key, index, quoted): `.key`, `[index]`, `["key"]`


def parse_path(path: str) -> list[Step]:
    """The steps of a reference's path after `output` or `.result`."""
    out: list[Step] = []
    for step in _STEP.finditer(path):
        dotted, idx, quoted = step.group(1), step.group(2), step.group(3)
        if idx is not None:
            out.append(("", int(idx), False))
        else:
            out.append((dotted if dotted is not None else quoted, None, quoted is not None))
    return out


def first_key(steps: list[Step], keys: Collection[str]) -> tuple[str | None, int]:
    """The key of `keys` the path starts with (dotted steps joined as `_walk` joins them) and how
    many steps it takes; (None, 0) if it names none of them."""
    if not steps or steps[0][1] is not None:
        return None, 0
    key = steps[0][0]
    if key in keys or steps[0][2]:
        return (key, 1) if key in keys else (None, 0)
    for j in range(1, len(steps)):
        if steps[j][1] is not None or steps[j][2]:
            break
        key = f"{key}.{steps[j][0]}"
        if key in keys:
            return key, j + 1
    return None, 0


def _walk(current: Any, steps: list[Step], ref: str, node: str) -> Any:
    i = 0
    while i < len(steps):
        key, idx, _quoted = steps[i]
        if idx is not None and isinstance(current, list) and idx < len(current):
            current, i = current[idx], i + 1
            continue
        if idx is None and isinstance(current, dict):
            found, taken = first_key(steps[i:], current)
            if found is not None:
                current, i = current[found], i + taken
                continue
        shown = f"[{idx}]" if idx is not None else (f'["{key}"]' if _quoted else f".{key}")
        raise TemplateError(f"{ref}: '{shown}' does not exist in the value of node '{node}'")
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
