"""DAG validation at submission and progress while it runs (SPEC sections 2 and 3).

Validation reports every problem it finds, most fundamental first, so the caller (a person or
an LLM planner) can fix them in one round. Progress is a pure function of node states: which
pending nodes become ready, which are skipped (and skipping propagates), so every DAG ends.
"""

from __future__ import annotations

import difflib
import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from orchestrator.domain import templates
from orchestrator.domain.model import (
    TERMINAL_NODE_STATES,
    CommandSpec,
    DagSpec,
    EdgeCondition,
    EdgeSpec,
    NodeKind,
    NodeState,
)
from orchestrator.domain.problems import Problem


@dataclass(frozen=True)
class Limits:
    max_nodes: int = 1000
    max_argument_bytes: int = 64 * 1024
    max_commands_per_node: int = 100


# ---------------------------------------------------------------- structure


@dataclass
class Graph:
    """Adjacency of a DAG by node id; edges keep their conditions."""

    nodes: list[str]
    incoming: dict[str, list[EdgeSpec]] = field(default_factory=dict)
    outgoing: dict[str, list[EdgeSpec]] = field(default_factory=dict)

    @classmethod
    def build(cls, nodes: Iterable[str], edges: Iterable[EdgeSpec]) -> Graph:
        ids = list(nodes)
        incoming: dict[str, list[EdgeSpec]] = {n: [] for n in ids}
        outgoing: dict[str, list[EdgeSpec]] = {n: [] for n in ids}
        for e in edges:
            incoming[e.target].append(e)
            outgoing[e.source].append(e)
        return cls(ids, incoming, outgoing)

    def ancestors(self, node: str) -> set[str]:
        seen: set[str] = set()
        stack = [e.source for e in self.incoming.get(node, [])]
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(e.source for e in self.incoming.get(n, []))
        return seen

    def roots(self) -> list[str]:
        return [n for n in self.nodes if not self.incoming[n]]


# ---------------------------------------------------------------- validation


def validate(spec: DagSpec, known_tools: Collection[str], limits: Limits = Limits()) -> list[Problem]:
    """Every problem with `spec`; an empty list means it may be stored and run."""
    problems: list[Problem] = []
    if len(spec.nodes) > limits.max_nodes:
        problems.append(
            Problem(
                "limit_exceeded",
                f"the DAG has {len(spec.nodes)} nodes; at most {limits.max_nodes} are allowed per task",
                {"limit": "nodes_per_task", "max": limits.max_nodes},
            )
        )
        if len(spec.nodes) > 10 * limits.max_nodes:
            return problems  # far too big to be worth examining further
    problems += _check_ids_and_edges(spec)
    # Every independent problem in one round: an edge to an unknown node is left out of the
    # cycle and ancestor checks (which need both its ends), and nothing else waits on it.
    ids = {n.id for n in spec.nodes}
    edges = [e for e in spec.edges if e.source in ids and e.target in ids]
    known = spec if len(edges) == len(spec.edges) else spec.model_copy(update={"edges": edges})
    graph = Graph.build([n.id for n in spec.nodes], edges)
    cycle = find_cycle(known)
    if cycle:
        problems.append(
            Problem(
                "dag_cycle",
                "the edges form a cycle: " + " -> ".join([*cycle, cycle[0]]),
                {"cycle": cycle},
            )
        )
    problems += _check_sizes(spec, limits)
    problems += _check_references(spec, graph)
    problems += _check_tools(spec, known_tools)
    return problems


def find_cycle(spec: DagSpec) -> list[str]:
    """The first cycle of the edges, named as networkx's `find_cycle` names it; [] if none."""
    if _acyclic(spec):
        return []  # the common case, in one pass (networkx takes a second for thousands of nodes)
    # Imported here: networkx costs half a second at import, and an orchestrator restarting after
    # a crash should be serving again before it validates its first DAG (recovery speed).
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(n.id for n in spec.nodes)
    g.add_edges_from((e.source, e.target) for e in spec.edges)
    try:
        edges = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return []
    return [str(u) for u, _v in edges]


def _acyclic(spec: DagSpec) -> bool:
    """Every node can be taken in topological order (Kahn): the edges form no cycle."""
    successors: dict[str, list[str]] = {n.id: [] for n in spec.nodes}
    waiting: dict[str, int] = dict.fromkeys(successors, 0)  # unfinished parents per node
    for e in spec.edges:
        successors.setdefault(e.source, []).append(e.target)
        successors.setdefault(e.target, [])
        waiting[e.target] = waiting.get(e.target, 0) + 1
        waiting.setdefault(e.source, 0)
    ready = [n for n, count in waiting.items() if count == 0]
    taken = 0
    while ready:
        node = ready.pop()
        taken += 1
        for target in successors[node]:
            waiting[target] -= 1
            if waiting[target] == 0:
                ready.append(target)
    return taken == len(waiting)


def argument_bytes(arguments: Mapping[str, object], limit: int) -> int | None:
    """The size of `arguments` as the limit counts it (`json.dumps` in UTF-8), or None when it is
    surely within `limit`. The standard encoder is the definition; orjson only shortcuts it:
    no byte of orjson's text becomes more than 6 bytes in `json.dumps` (a `\u007f` escape), so
    6 x orjson's length within the limit is proof enough. Otherwise the exact size is counted."""
    try:
        if 6 * len(orjson.dumps(arguments)) <= limit:
            return None
    except TypeError:  # something orjson will not take (a huge int, a non-text key): count exactly
        pass
    size = len(json.dumps(arguments).encode())
    return size if size > limit else None


def _check_ids_and_edges(spec: DagSpec) -> list[Problem]:
    problems = []
    seen: set[str] = set()
    for n in spec.nodes:
        if n.id in seen:
            problems.append(Problem("duplicate_node", f"node id '{n.id}' is used twice", {"node": n.id}))
        seen.add(n.id)
    pairs: set[tuple[str, str]] = set()
    for e in spec.edges:
        for end in (e.source, e.target):
            if end not in seen:
                problems.append(
                    Problem(
                        "unknown_node",
                        f"edge {e.source} -> {e.target} names node '{end}', which is not in the DAG"
                        + _nearest_hint(end, seen),
                        {"node": end, "edge": {"from": e.source, "to": e.target}},
                    )
                )
        if (e.source, e.target) in pairs:
            problems.append(
                Problem(
                    "duplicate_edge",
                    f"edge {e.source} -> {e.target} is given twice; keep one",
                    {"edge": {"from": e.source, "to": e.target}},
                )
            )
        pairs.add((e.source, e.target))
    return problems


def _check_sizes(spec: DagSpec, limits: Limits) -> list[Problem]:
    problems = []
    for n in spec.nodes:
        problems += _command_sizes(n.id, "command", n.commands, limits)
        problems += _command_sizes(n.id, "verify", n.verify, limits)
        if n.instruction and len(n.instruction.encode()) > limits.max_argument_bytes:
            problems.append(
                Problem(
                    "limit_exceeded",
                    f"node '{n.id}' has an instruction over {limits.max_argument_bytes} bytes",
                    {"node": n.id, "limit": "argument_bytes", "max": limits.max_argument_bytes},
                )
            )
    return problems


def _command_sizes(node_id: str, label: str, commands: list[CommandSpec], limits: Limits) -> list[Problem]:
    """Too many commands (or verify commands) in a node, or too many bytes of arguments in one."""
    what = "command" if label == "command" else "verify command"
    problems = []
    if len(commands) > limits.max_commands_per_node:
        problems.append(
            Problem(
                "limit_exceeded",
                f"node '{node_id}' has {len(commands)} {what}s; at most {limits.max_commands_per_node} are allowed",
                {"node": node_id, "limit": "commands_per_node", "max": limits.max_commands_per_node},
            )
        )
    for i, c in enumerate(commands):
        size = argument_bytes(c.arguments, limits.max_argument_bytes)
        if size is not None:
            problems.append(
                Problem(
                    "limit_exceeded",
                    f"node '{node_id}' {what} {i} ({c.tool}) has {size} bytes of arguments; at most "
                    f"{limits.max_argument_bytes} are allowed",
                    {"node": node_id, label: i, "limit": "argument_bytes", "max": limits.max_argument_bytes},
                )
            )
    return problems


def _check_references(spec: DagSpec, graph: Graph) -> list[Problem]:
    problems = []
    ids = set(graph.nodes)
    fanned = {n.id for n in spec.nodes if n.for_each is not None}
    for n in spec.nodes:
        args = [c.arguments for c in n.commands] + [c.arguments for c in n.verify]
        problems += _fan_out_references(n.id, args, fanned)
        for bad in templates.malformed(args):
            meant = templates.suggestion(bad)
            hint = f"; did you mean {meant}?" if meant else ""
            problems.append(
                Problem(
                    "invalid_reference",
                    f"node '{n.id}': '{bad}' is not a valid reference{hint} (write ${{nodes.<id>.output}} or "
                    "${nodes.<id>.results[<i>].result}, optionally followed by .key or [index])",
                    {"node": n.id, "reference": bad, **({"suggestion": meant} if meant else {})},
                )
            )
        refs = templates.references(args)
        if not refs:
            continue
        ancestors = graph.ancestors(n.id)
        for ref in sorted(refs):
            if ref not in ids:
                problems.append(
                    Problem(
                        "unknown_node",
                        f"node '{n.id}' references node '{ref}', which is not in the DAG" + _nearest_hint(ref, ids),
                        {"node": n.id, "reference": ref},
                    )
                )
            elif ref not in ancestors:
                problems.append(
                    Problem(
                        "invalid_reference",
                        f"node '{n.id}' references node '{ref}', which is not an ancestor, so its output "
                        f"may not exist yet; add an edge {ref} -> {n.id}",
                        {"node": n.id, "reference": ref},
                    )
                )
    return problems


def _fan_out_references(node_id: str, args: list[dict[str, object]], fanned: Collection[str]) -> list[Problem]:
    """A fan-out node's output is a map from device name to output; it has no `results` list."""
    problems = []
    for ref, root, _steps, text in templates.parts(args):
        if ref in fanned and root is None:
            problems.append(
                Problem(
                    "invalid_reference",
                    f"node '{node_id}': {text} names a result of node '{ref}', which fans out over devices: its "
                    f"output is a map from device name to that device's output; write ${{nodes.{ref}.output.<device>}}",
                    {"node": node_id, "reference": ref},
                )
            )
    return problems


def _check_tools(spec: DagSpec, known_tools: Collection[str]) -> list[Problem]:
    problems = []
    known = list(known_tools)
    for n in spec.nodes:
        commands = n.verify if n.kind is NodeKind.AGENT else [*n.commands, *n.verify]
        for c in commands:
            if c.tool not in known_tools:
                nearest = difflib.get_close_matches(c.tool, known, n=3, cutoff=0.5)
                hint = f"; did you mean {', '.join(nearest)}?" if nearest else ""
                problems.append(
                    Problem(
                        "unknown_tool",
                        f"node '{n.id}' uses tool '{c.tool}', which no enrolled device offers{hint}",
                        {"node": n.id, "tool": c.tool, "nearest": nearest},
                    )
                )
    return problems


def _nearest_hint(name: str, names: Collection[str]) -> str:
    nearest = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f"; did you mean '{nearest[0]}'?" if nearest else ""


# ---------------------------------------------------------------- progress


def edge_status(edge: EdgeSpec, source_state: NodeState) -> bool | None:
    """True: satisfied; False: can never be satisfied; None: source not finished yet."""
    if source_state not in TERMINAL_NODE_STATES:
        return None
    on = edge.on
    if on is EdgeCondition.SUCCESS:
        return source_state is NodeState.SUCCEEDED
    if on is EdgeCondition.FAILURE:
        return source_state is NodeState.FAILED
    return source_state is not NodeState.CANCELLED  # always: any outcome but a cancellation


def advance(graph: Graph, states: Mapping[str, NodeState], changed: Iterable[str]) -> dict[str, NodeState]:
    """Pending nodes that become READY or SKIPPED after `changed` nodes changed state.

    Skips propagate: a skipped node's successors are examined in turn. Returns only changes.
    """
    result: dict[str, NodeState] = {}
    work = list(dict.fromkeys([e.target for c in changed for e in graph.outgoing.get(c, ())]))
    while work:
        node = work.pop()
        if result.get(node, states[node]) is not NodeState.PENDING:
            continue
        verdict = _verdict(graph.incoming[node], result, states)
        if verdict is False:
            result[node] = NodeState.SKIPPED
            work.extend(e.target for e in graph.outgoing[node])
        elif verdict:
            result[node] = NodeState.READY
    return result


def _verdict(incoming: list[EdgeSpec], result: Mapping[str, NodeState], states: Mapping[str, NodeState]) -> bool | None:
    """False if an edge into a node can never be satisfied, True if all are, else None."""
    verdict: bool | None = True
    for e in incoming:
        source = e.source
        status = edge_status(e, result[source] if source in result else states[source])
        if status is False:
            return False
        if status is None:
            verdict = None
    return verdict


def initial_states(graph: Graph) -> dict[str, NodeState]:
    """Roots start READY, every other node PENDING."""
    roots = set(graph.roots())
    return {n: (NodeState.READY if n in roots else NodeState.PENDING) for n in graph.nodes}


def failure_handled(graph: Graph, node: str) -> bool:
    return any(e.on is EdgeCondition.FAILURE for e in graph.outgoing.get(node, []))


def dependents(graph: Graph) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for n in graph.nodes:
        for e in graph.outgoing[n]:
            out[n].add(e.target)
    return out
