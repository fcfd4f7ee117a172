"""A DAG written in Python as it is in YAML (SPEC section 2): nodes of commands (or an agent's
instruction) with their placement, edges taken on success, failure or always, fan-out, verify
commands, and references to upstream outputs that read as attribute paths:

    dag = Dag("disk-report")
    usage = dag.node("usage", call("shell.run", {"argv": ["df", "-h", "/"]}), labels={"role": "web"})
    dag.node("save", call("files.write", {"path": "disk.txt", "content": usage.output.stdout}), after=usage)

`Dag.to_dict()` is exactly the `dag` a submission takes. What can be checked without the server
is checked there (duplicate ids, edges and references to unknown nodes, references to nodes that
are not ancestors, cycles) and refused with a `DagError` carrying the server's codes; the rest
(tools, placement, arguments against the tools' schemas) is the server's `validate`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from orrery.sdk.errors import DagError

On = Literal["success", "failure", "always"]
Platform = Literal["linux", "windows", "macos", "android", "ios", "other"]

_KEY = re.compile(r"^[A-Za-z0-9_-]+$")  # a path step written `.key`; other keys are `["key"]`
# The node a `${nodes.<id>.output...}` or `${nodes.<id>.results[<i>].result...}` reference names.
_REFERENCE = re.compile(r"\$\{nodes\.([A-Za-z0-9][A-Za-z0-9_-]*)\.(?:output|results\[\d+\]\.result)")


class Retry(TypedDict, total=False):
    """A node's retry policy (retries happen only when they are safe: SPEC section 2)."""

    max_attempts: int
    backoff_s: float
    backoff_max_s: float


class ForEach(TypedDict, total=False):
    """Fan-out: the node runs once on every matching device (`labels`/`platform`, or `devices`
    by name), `canary` devices first, at most `max_parallel` at once, stopping at the
    `failure_budget`-th failed child."""

    labels: dict[str, str]
    platform: Platform
    devices: list[str]
    max_parallel: int
    canary: int
    failure_budget: int


class Ref:
    """A reference to an upstream node's output, extended by attribute and item access:
    `node.output.stdout`, `node.output["web-1.example.com"]`, `node.result(0)[2]`. As an
    argument on its own it takes the referenced value with its type; inside a longer string
    (an f-string) its text."""

    def __init__(self, node_id: str, path: str) -> None:
        self.node_id = node_id
        self.path = path

    def __getattr__(self, key: str) -> Ref:
        if key.startswith("_"):
            raise AttributeError(key)
        return self[key]

    def __getitem__(self, key: str | int) -> Ref:
        if isinstance(key, int):
            return Ref(self.node_id, f"{self.path}[{key}]")
        step = f".{key}" if _KEY.match(key) else f'["{key}"]'
        return Ref(self.node_id, self.path + step)

    def __str__(self) -> str:
        return "${" + self.path + "}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"Ref({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref | str) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))


@dataclass(frozen=True)
class Command:
    """One tool call of a node: `call("shell.run", {"argv": ["uname", "-a"]}, timeout_s=30)`."""

    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    idempotent: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.tool, "arguments": _plain(self.arguments)}
        if self.timeout_s is not None:
            out["timeout_s"] = self.timeout_s
        if self.idempotent is not None:
            out["idempotent"] = self.idempotent
        return out


def call(
    tool: str,
    arguments: Mapping[str, Any] | None = None,
    *,
    timeout_s: float | None = None,
    idempotent: bool | None = None,
) -> Command:
    """A command: the tool (`namespace.tool`), its arguments (references allowed anywhere in
    them), its timeout, and whether running it twice does no harm (so a failed attempt may be
    retried although the tool is not annotated idempotent)."""
    return Command(tool, dict(arguments or {}), timeout_s, idempotent)


@dataclass(frozen=True)
class NodeRef:
    """A node added to a `Dag`: its id, its JSON, and references to its output."""

    id: str
    spec: dict[str, Any]

    @property
    def output(self) -> Ref:
        """`${nodes.<id>.output}`: the last command's result (a fan-out node's: by device name)."""
        return Ref(self.id, f"nodes.{self.id}.output")

    def result(self, index: int) -> Ref:
        """`${nodes.<id>.results[<index>].result}`: the result of one of its commands."""
        return Ref(self.id, f"nodes.{self.id}.results[{index}].result")


NodeLike = NodeRef | str


class Dag:
    """A task's DAG, built node by node; `to_dict()` is the `dag` of a submission."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self._nodes: dict[str, NodeRef] = {}
        self._edges: list[dict[str, str]] = []

    def node(
        self,
        node_id: str,
        *commands: Command,
        device: str | None = None,
        labels: Mapping[str, str] | None = None,
        platform: Platform | None = None,
        for_each: ForEach | None = None,
        verify: Sequence[Command] = (),
        retry: Retry | None = None,
        timeout_s: float | None = None,
        queue_timeout_s: float | None = None,
        priority: int | None = None,
        after: NodeLike | Sequence[NodeLike] = (),
        on: On = "success",
    ) -> NodeRef:
        """A `tool` node running `commands` in order on one device: the device named (id or
        name), or any matching `labels`/`platform`, or (neither) any with every tool it uses;
        with `for_each`, once on each matching device. `after`: the nodes it runs after, each
        edge taken `on` their success (default), failure (compensation) or either (always)."""
        spec: dict[str, Any] = {"id": node_id}
        spec |= _placement(device, labels, platform)
        if for_each is not None:
            spec["for_each"] = dict(for_each)
        spec["commands"] = [c.to_dict() for c in commands]
        return self._add(node_id, spec, verify, retry, timeout_s, queue_timeout_s, priority, after, on)

    def agent(
        self,
        node_id: str,
        instruction: str,
        *,
        max_steps: int | None = None,
        device: str | None = None,
        labels: Mapping[str, str] | None = None,
        platform: Platform | None = None,
        verify: Sequence[Command] = (),
        retry: Retry | None = None,
        timeout_s: float | None = None,
        queue_timeout_s: float | None = None,
        priority: int | None = None,
        after: NodeLike | Sequence[NodeLike] = (),
        on: On = "success",
    ) -> NodeRef:
        """An `agent` node: a model drives the device's tools step by step to do `instruction`
        (the server needs an LLM; without one the submission is refused `planner_unavailable`)."""
        spec: dict[str, Any] = {"id": node_id, "kind": "agent"}
        spec |= _placement(device, labels, platform)
        spec["instruction"] = instruction
        if max_steps is not None:
            spec["max_steps"] = max_steps
        return self._add(node_id, spec, verify, retry, timeout_s, queue_timeout_s, priority, after, on)

    def edge(self, source: NodeLike, target: NodeLike, on: On = "success") -> Dag:
        """`source` -> `target`, taken `on` success (default), failure or always."""
        edge = {"from": _id(source), "to": _id(target)}
        if on != "success":
            edge["on"] = on
        self._edges.append(edge)
        return self

    @property
    def nodes(self) -> list[NodeRef]:
        return list(self._nodes.values())

    def __getitem__(self, node_id: str) -> NodeRef:
        return self._nodes[node_id]

    def check(self) -> None:
        """Raise `DagError` listing every problem found without the server: edges and
        references naming unknown nodes, references to nodes that are not ancestors, a cycle."""
        problems = _edge_problems(self._nodes, self._edges)
        order, cycle = _order(list(self._nodes), self._edges)
        if cycle:
            problems.append(
                {
                    "code": "dag_cycle",
                    "message": "the edges form a cycle: " + " -> ".join([*cycle, cycle[0]]),
                    "cycle": cycle,
                }
            )
        else:
            problems += _reference_problems(self._nodes, order, self._edges)
        if problems:
            raise DagError(problems)

    def to_dict(self) -> dict[str, Any]:
        """The DAG as the API takes it, `{nodes, edges}` (checked first: see `check`)."""
        self.check()
        return copy.deepcopy({"nodes": [n.spec for n in self._nodes.values()], "edges": self._edges})

    def _add(
        self,
        node_id: str,
        spec: dict[str, Any],
        verify: Sequence[Command],
        retry: Retry | None,
        timeout_s: float | None,
        queue_timeout_s: float | None,
        priority: int | None,
        after: NodeLike | Sequence[NodeLike],
        on: On,
    ) -> NodeRef:
        if node_id in self._nodes:
            raise DagError(
                [{"code": "duplicate_node", "message": f"node id '{node_id}' is used twice", "node": node_id}]
            )
        if verify:
            spec["verify"] = [c.to_dict() for c in verify]
        for key, value in (
            ("retry", dict(retry) if retry is not None else None),
            ("queue_timeout_s", queue_timeout_s),
            ("timeout_s", timeout_s),
            ("priority", priority),
        ):
            if value is not None:
                spec[key] = value
        node = NodeRef(node_id, spec)
        self._nodes[node_id] = node
        for source in [after] if isinstance(after, NodeRef | str) else after:
            self.edge(source, node, on)
        return node


def _id(node: NodeLike) -> str:
    return node.id if isinstance(node, NodeRef) else node


def _placement(device: str | None, labels: Mapping[str, str] | None, platform: str | None) -> dict[str, Any]:
    placement: dict[str, Any] = {}
    if device is not None:
        placement["device"] = device
    if labels:
        placement["labels"] = dict(labels)
    if platform is not None:
        placement["platform"] = platform
    return {"placement": placement} if placement else {}


def _plain(value: Any) -> Any:
    """`value` as JSON: references become their text, mappings dicts, sequences lists."""
    if isinstance(value, Ref):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _edge_problems(nodes: Mapping[str, NodeRef], edges: list[dict[str, str]]) -> list[dict[str, Any]]:
    problems: list[dict[str, Any]] = []
    for e in edges:
        for end in (e["from"], e["to"]):
            if end not in nodes:
                problems.append(
                    {
                        "code": "unknown_node",
                        "message": f"edge {e['from']} -> {e['to']} names node '{end}', which is not in the DAG",
                        "node": end,
                        "edge": {"from": e["from"], "to": e["to"]},
                    }
                )
    return problems


def _order(ids: list[str], edges: list[dict[str, str]]) -> tuple[list[str], list[str]]:
    """The nodes in an order where each comes after its parents, and one cycle (its nodes in
    order, from the one given first) when some nodes cannot be ordered."""
    parents: dict[str, list[str]] = {i: [] for i in ids}
    children: dict[str, list[str]] = {i: [] for i in ids}
    for e in edges:
        if e["from"] in parents and e["to"] in parents:
            parents[e["to"]].append(e["from"])
            children[e["from"]].append(e["to"])
    waiting = {i: len(parents[i]) for i in ids}
    ready = [i for i in ids if waiting[i] == 0]
    order: list[str] = []
    while ready:
        node = ready.pop()
        order.append(node)
        for child in children[node]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if len(order) == len(ids):
        return order, []
    # Every node left has a parent left: walking up from one must come back to a node seen.
    left = set(ids) - set(order)
    node = next(i for i in ids if i in left)
    seen: dict[str, int] = {}
    path: list[str] = []
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(p for p in parents[node] if p in left)
    cycle = path[seen[node] :][::-1]  # walked against the edges: reversed, it follows them
    first = min(range(len(cycle)), key=lambda k: ids.index(cycle[k]))
    return order, cycle[first:] + cycle[:first]


def _ancestors(order: list[str], edges: list[dict[str, str]]) -> dict[str, set[str]]:
    parents: dict[str, set[str]] = {i: set() for i in order}
    for e in edges:
        if e["to"] in parents and e["from"] in parents:
            parents[e["to"]].add(e["from"])
    found: dict[str, set[str]] = {}
    for node in order:  # parents first
        found[node] = set(parents[node]).union(*(found[p] for p in parents[node]))
    return found


def _reference_problems(
    nodes: Mapping[str, NodeRef], order: list[str], edges: list[dict[str, str]]
) -> list[dict[str, Any]]:
    problems: list[dict[str, Any]] = []
    ancestors = _ancestors(order, edges)
    for node in nodes.values():
        commands = [*node.spec.get("commands", []), *node.spec.get("verify", [])]
        named = {m.group(1) for c in commands for text in _strings(c["arguments"]) for m in _REFERENCE.finditer(text)}
        for ref in sorted(named):
            if ref not in nodes:
                problems.append(
                    {
                        "code": "unknown_node",
                        "message": f"node '{node.id}' references node '{ref}', which is not in the DAG",
                        "node": node.id,
                        "reference": ref,
                    }
                )
            elif ref not in ancestors[node.id]:
                problems.append(
                    {
                        "code": "invalid_reference",
                        "message": f"node '{node.id}' references node '{ref}', which is not an ancestor, so its "
                        f"output may not exist yet; add an edge {ref} -> {node.id}",
                        "node": node.id,
                        "reference": ref,
                    }
                )
    return problems
