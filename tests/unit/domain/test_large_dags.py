"""The shortcuts that make checking a large DAG cheap give exactly the answers of the plain checks:
argument bytes at the limit, one schema error per node, the cycle networkx names, candidates."""

from __future__ import annotations

import json
import random
from typing import Any

import networkx as nx
import pytest
from jsonschema import Draft202012Validator

from orchestrator.domain import checks, dag
from orchestrator.domain.model import AdminState, DagSpec, Liveness
from orchestrator.domain.placement import DeviceView

TOOLS = {"shell.run"}


def spec(nodes: list[dict[str, Any]], edges: list[tuple[str, str]] | None = None) -> DagSpec:
    return DagSpec.model_validate({"nodes": nodes, "edges": [{"from": a, "to": b} for a, b in edges or []]})


def size_problems(arguments: dict[str, Any], limit: int) -> list[str]:
    s = spec([{"id": "n", "commands": [{"tool": "shell.run", "arguments": arguments}]}])
    return [p.message for p in dag.validate(s, TOOLS, dag.Limits(max_argument_bytes=limit))]


@pytest.mark.parametrize(
    "arguments",
    [
        {"text": "x" * 200},
        {"text": "é" * 50},  # \u00e9 in json.dumps: 6 bytes each, 2 in UTF-8
        {"text": "\x7f" * 40},  # DEL: 1 byte raw, 6 escaped
        {"text": "🛰" * 20},  # a surrogate pair: 12 bytes escaped
        {"numbers": [1e-7, 1e16, 0.1, -0.0, 10**18], "nested": {"a": [True, None, {"b": "c"}]}},
        {"big": 2**70},  # more than 64 bits: orjson refuses it, json.dumps counts it
        {"lone": "\ud800"},  # a lone surrogate: orjson refuses it too
    ],
)
def test_argument_bytes_are_counted_as_json_dumps_at_the_limit_and_one_over(arguments: dict[str, Any]) -> None:
    exact = len(json.dumps(arguments).encode())
    assert size_problems(arguments, exact) == []
    (message,) = size_problems(arguments, exact - 1)
    assert message == (
        f"node 'n' command 0 (shell.run) has {exact} bytes of arguments; at most {exact - 1} are allowed"
    )


def test_the_default_limit_is_exact_for_a_64_kib_argument() -> None:
    limit = dag.Limits().max_argument_bytes
    overhead = len(json.dumps({"text": ""}).encode())
    assert size_problems({"text": "x" * (limit - overhead)}, limit) == []
    (message,) = size_problems({"text": "x" * (limit - overhead + 1)}, limit)
    assert f"has {limit + 1} bytes of arguments" in message
    # non-ASCII text counts as json.dumps escapes it, not as its UTF-8 bytes
    escaped = (limit - overhead) // 6
    assert size_problems({"text": "é" * escaped}, limit) == []
    assert size_problems({"text": "é" * (escaped + 1)}, limit) != []


def catalogue_device(name: str, schema: dict[str, Any], labels: dict[str, str] | None = None) -> checks.CatalogDevice:
    view = DeviceView(
        id=f"dev_{name}",
        name=name,
        labels=labels or {},
        platform="linux",
        tools=frozenset({"shell.run"}),
        liveness=Liveness.ONLINE,
    )
    return checks.CatalogDevice(view, {"shell.run": {"name": "shell.run", "input_schema": schema}})


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"argv": {"type": "array", "items": {"type": "string"}}},
    "required": ["argv"],
    "additionalProperties": False,
}


def test_a_schema_error_is_reported_once_per_node_of_a_large_dag() -> None:
    reordered = dict(reversed(list(SCHEMA.items())))  # the same schema, its keys in another order
    devices = [catalogue_device(f"d{i}", SCHEMA if i % 2 else reordered) for i in range(20)]
    nodes = [{"id": f"n{i}", "commands": [{"tool": "shell.run", "arguments": {"argv": "ls"}}]} for i in range(300)]
    problems = checks.argument_problems(spec(nodes), devices)
    assert [p.extra["node_id"] for p in problems] == [f"n{i}" for i in range(300)]
    assert {p.message.split(": ", 1)[1] for p in problems} == {"argument 'argv': 'ls' is not of type 'array'"}
    assert all(p.extra["field"] == "argv" and p.code == "invalid_arguments" for p in problems)


def test_a_schema_is_checked_against_its_meta_schema_once_per_dag_not_per_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[object] = []
    check = Draft202012Validator.check_schema

    def counted(schema: Any) -> None:
        calls.append(schema)
        check(schema)

    monkeypatch.setattr(Draft202012Validator, "check_schema", counted)
    fresh = {**SCHEMA, "description": f"seen by no other test {random.random()}"}
    devices = [catalogue_device(f"d{i}", fresh) for i in range(10)]
    nodes = [{"id": f"n{i}", "commands": [{"tool": "shell.run", "arguments": {"argv": ["ls"]}}]} for i in range(100)]
    assert checks.argument_problems(spec(nodes), devices) == []
    assert len(calls) == 1


def test_a_broken_schema_stays_unjudged_on_every_node() -> None:
    devices = [catalogue_device("a", {"type": 5})]
    nodes = [{"id": f"n{i}", "commands": [{"tool": "shell.run", "arguments": {"argv": 1}}]} for i in range(3)]
    assert checks.argument_problems(spec(nodes), devices) == []


def networkx_cycle(s: DagSpec) -> list[str]:
    g = nx.DiGraph()
    g.add_nodes_from(n.id for n in s.nodes)
    g.add_edges_from((e.source, e.target) for e in s.edges)
    try:
        return [str(u) for u, _v in nx.find_cycle(g)]
    except nx.NetworkXNoCycle:
        return []


def test_a_cycle_is_named_as_networkx_names_it_and_an_acyclic_dag_has_none() -> None:
    rng = random.Random(16)
    found = 0
    for _ in range(300):
        ids = [f"n{i}" for i in range(rng.randint(1, 12))]
        edges = list({(rng.choice(ids), rng.choice(ids)) for _ in range(rng.randint(0, 15))})
        s = spec([{"id": i, "commands": [{"tool": "shell.run"}]} for i in ids], edges)
        expected = networkx_cycle(s)
        assert dag.find_cycle(s) == expected
        found += bool(expected)
        problems = dag.validate(s, TOOLS)
        if expected:
            (p,) = problems
            assert p.message == "the edges form a cycle: " + " -> ".join([*expected, expected[0]])
            assert p.extra == {"cycle": expected}
    assert 50 < found < 250  # both kinds were tried


def test_placement_per_signature_gives_each_node_the_devices_judging_it_alone_would() -> None:
    devices = [
        checks.CatalogDevice(
            DeviceView(
                id=f"dev{i}",
                name=f"d{i}",
                labels={"gpu": str(i % 2)},
                platform="linux" if i % 3 else "macos",
                tools=frozenset({"shell.run", "files.read"} if i % 4 else {"shell.run"}),
                admin=AdminState.REVOKED if i == 5 else AdminState.ACTIVE,
            )
        )
        for i in range(12)
    ]
    nodes = [
        {"id": "a", "commands": [{"tool": "shell.run"}]},
        {"id": "b", "commands": [{"tool": "files.read"}, {"tool": "shell.run"}], "placement": {"labels": {"gpu": "1"}}},
        {"id": "c", "commands": [{"tool": "shell.run"}, {"tool": "files.read"}], "placement": {"labels": {"gpu": "1"}}},
        {"id": "d", "commands": [{"tool": "shell.run"}], "placement": {"platform": "macos"}},
        {"id": "e", "commands": [{"tool": "shell.run"}], "placement": {"device": "d7"}},
        {"id": "f", "kind": "agent", "instruction": "look around"},
    ]
    s = spec(nodes)
    catalog = checks.Catalog(devices)
    for node in s.nodes:
        assert catalog.candidates(node) == checks.candidates(node, devices)
    assert catalog.candidates(s.nodes[1]) is catalog.candidates(s.nodes[2])  # one signature
