"""The DAG builder writes exactly the JSON a DAG file holds, and refuses locally what the server
would refuse for its structure, with the server's codes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.dagfile import parse_dag_text
from orchestrator.domain.dag import validate
from orchestrator.domain.model import DagSpec
from orrery import Dag, DagError, InvalidRequest, call

ROOT = Path(__file__).resolve().parents[3]


def reference_example(file_name: str) -> dict[str, Any]:
    """A DAG example of docs/reference/dag.md, read as `orrery submit` reads it."""
    text = (ROOT / "docs" / "reference" / "dag.md").read_text()
    block = next(b for b in re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S) if file_name in b.splitlines()[0])
    parsed: dict[str, Any] = parse_dag_text(block, file_name)
    return parsed


def test_the_reference_example_written_in_python_is_the_json_its_yaml_gives() -> None:
    dag = Dag("disk-report")
    usage = dag.node(
        "usage",
        call("shell.run", {"argv": ["df", "-h", "/"]}, timeout_s=30, idempotent=True),
        labels={"role": "web"},
        retry={"max_attempts": 3, "backoff_s": 1, "backoff_max_s": 10},
    )
    dag.node(
        "save",
        call("files.write", {"path": "disk.txt", "content": usage.output.stdout}),
        device="analysis",
        after=usage,
    )
    dag.node(
        "note-failure",
        call("files.write", {"path": "disk-failed.txt", "content": "df failed on the web device\n"}),
        device="analysis",
        after=usage,
        on="failure",
    )
    expected = reference_example("disk-report.yaml")
    assert {"name": dag.name, **dag.to_dict()} == expected


def test_a_fan_out_with_verify_commands_is_the_json_its_yaml_gives() -> None:
    dag = Dag("config-rollout")
    deploy = dag.node(
        "deploy",
        call("files.write", {"path": "app.conf", "content": "workers = 4\n"}),
        for_each={"labels": {"role": "web"}, "canary": 1, "max_parallel": 1, "failure_budget": 1},
        verify=[call("files.read", {"path": "app.conf"})],
    )
    dag.node(
        "record",
        call("files.write", {"path": "rollout.txt", "content": f"web-2 {deploy.output['web-2'].sha256}\n"}),
        device="analysis",
        after=deploy,
    )
    assert {"name": dag.name, **dag.to_dict()} == reference_example("rollout.yaml")


def test_references_read_as_paths_into_the_output() -> None:
    dag = Dag()
    node = dag.node("probe", call("shell.run", {"argv": ["uname"]}))
    assert str(node.output) == "${nodes.probe.output}"
    assert str(node.output.stdout) == "${nodes.probe.output.stdout}"
    assert str(node.output["web-1.example.com"].stdout) == '${nodes.probe.output["web-1.example.com"].stdout}'
    assert str(node.result(0)[2]) == "${nodes.probe.results[0].result[2]}"
    assert f"got: {node.output.stdout}" == "got: ${nodes.probe.output.stdout}"


def test_a_reference_alone_is_passed_as_the_reference_text() -> None:
    dag = Dag()
    first = dag.node("first", call("sim.noop", {"echo": 41}))
    dag.node("second", call("sim.noop", {"echo": first.output.echo, "all": [first.output]}), after=first)
    (_, second) = dag.to_dict()["nodes"]
    assert second["commands"][0]["arguments"] == {
        "echo": "${nodes.first.output.echo}",
        "all": ["${nodes.first.output}"],
    }


def test_every_field_a_node_can_have_is_accepted_by_the_servers_model() -> None:
    dag = Dag("everything")
    probe = dag.node(
        "probe",
        call("shell.run", {"argv": ["true"]}, timeout_s=5),
        platform="linux",
        retry={"max_attempts": 2},
        timeout_s=60,
        queue_timeout_s=30,
        priority=5,
    )
    dag.agent(
        "look",
        "Say what the probe found",
        max_steps=5,
        device="analysis",
        verify=[call("files.read", {"path": "x"})],
        after=probe,
        on="always",
    )
    dag.node("fan", call("files.list", {"path": "."}), for_each={"devices": ["web-1", "web-2"]})
    dag.edge("look", "fan", on="failure")
    spec = DagSpec.model_validate(dag.to_dict())
    assert [n.id for n in spec.nodes] == ["probe", "look", "fan"]
    assert [(e.source, e.target, e.on.value) for e in spec.edges] == [
        ("probe", "look", "always"),
        ("look", "fan", "failure"),
    ]


def test_a_node_id_used_twice_is_refused_at_once() -> None:
    dag = Dag()
    dag.node("a", call("sim.noop"))
    with pytest.raises(DagError) as refused:
        dag.node("a", call("sim.noop"))
    assert refused.value.code == "duplicate_node"
    assert isinstance(refused.value, InvalidRequest)


def test_an_edge_to_an_unknown_node_is_refused_as_unknown_node() -> None:
    dag = Dag()
    dag.node("a", call("sim.noop"))
    dag.edge("a", "ghost")
    with pytest.raises(DagError) as refused:
        dag.to_dict()
    assert refused.value.code == "unknown_node"
    assert refused.value.problems[0]["node"] == "ghost"


def test_a_cycle_is_refused_and_named_as_the_server_names_it() -> None:
    dag = Dag()
    for n in "xyz":
        dag.node(n, call("sim.noop"))
    dag.edge("y", "z").edge("z", "x").edge("x", "y")
    with pytest.raises(DagError) as refused:
        dag.check()
    assert refused.value.code == "dag_cycle"
    assert refused.value.problems[0]["cycle"] == ["x", "y", "z"]


def test_a_reference_to_a_node_that_is_not_an_ancestor_is_refused() -> None:
    dag = Dag()
    a = dag.node("a", call("sim.noop"))
    dag.node("b", call("sim.noop", {"echo": a.output}))  # no edge a -> b
    dag.node("c", call("sim.noop", {"echo": "${nodes.nobody.output}"}), after="a")
    with pytest.raises(DagError) as refused:
        dag.check()
    assert [(p["code"], p["node"]) for p in refused.value.problems] == [
        ("invalid_reference", "b"),
        ("unknown_node", "c"),
    ]


def _codes_of_the_server(dag: dict[str, Any]) -> list[str]:
    spec = DagSpec.model_validate(dag)
    tools = {c.tool for n in spec.nodes for c in n.commands}
    return sorted(p.code for p in validate(spec, tools))


@pytest.mark.parametrize(
    "edges",
    [
        [("a", "ghost")],
        [("a", "b"), ("b", "a")],
        [("a", "b"), ("b", "c"), ("c", "a"), ("c", "nowhere")],
        [],
    ],
)
def test_the_builder_refuses_what_the_servers_checks_refuse_with_the_same_codes(edges: list[tuple[str, str]]) -> None:
    dag = Dag()
    a = dag.node("a", call("sim.noop"))
    dag.node("b", call("sim.noop"))
    dag.node("c", call("sim.noop", {"echo": a.output}))  # a reference with no edge unless one is given
    for source, target in edges:
        dag.edge(source, target)
    nodes = [dict(n.spec) for n in dag.nodes]
    raw = {"nodes": nodes, "edges": [{"from": s, "to": t} for s, t in edges]}
    try:
        dag.check()
        local: list[str] = []
    except DagError as refused:
        local = sorted(p["code"] for p in refused.problems)
    server = _codes_of_the_server(raw)
    # The server also checks references in a cyclic DAG; the builder names the cycle first.
    assert local == [c for c in server if not (c == "invalid_reference" and "dag_cycle" in server)]
    assert local, "every case here has a problem"
