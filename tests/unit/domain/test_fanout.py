"""Fan-out rules (issue 20), pure: which devices a node fans out to and in what order, how its
rollout releases and halts, and how the node ends; driven through `TaskRun` as the engine does,
including a property test that every rollout ends by the rules whatever its children do."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain import fanout, templates
from orchestrator.domain.model import AdminState, DagSpec, Liveness, NodeState
from orchestrator.domain.placement import DeviceView
from orchestrator.domain.run import AttemptOutcome, TaskRun

TOOLS = frozenset({"shell.run"})


def view(name: str, admin: AdminState = AdminState.ACTIVE, tools: frozenset[str] = TOOLS, **labels: str) -> DeviceView:
    return DeviceView(
        id=f"dev_{name}",
        name=name,
        labels=labels or {"role": "web"},
        tools=tools,
        admin=admin,
        liveness=Liveness.ONLINE,
    )


def spec(**for_each: Any) -> Any:
    selector = {} if "devices" in for_each else {"labels": {"role": "web"}}
    node = {"id": "x", "for_each": {**selector, **for_each}, "commands": [{"tool": "shell.run"}]}
    return DagSpec.model_validate({"nodes": [node]})


def started(n: int, **for_each: Any) -> tuple[TaskRun, list[str]]:
    dag = spec(**for_each)
    run = TaskRun("t", dag.nodes, dag.edges)
    run.start(0.0)
    found, left = fanout.targets(dag.nodes[0], [view(f"w{i}") for i in range(n)])
    run.fan_out("x", found, left, 0.0)
    return run, run.rollouts["x"].units


def ready(run: TaskRun, units: list[str]) -> list[str]:
    return [u for u in units if run.children[u].state is NodeState.READY]


def end(run: TaskRun, unit: str, ok: bool) -> None:
    run.mark_running(unit)
    run.attempt_ended(unit, AttemptOutcome(ok, output={"ok": ok}, error_code="" if ok else "tool_error"), 1.0, 0.5)


def test_devices_matching_labels_fan_out_by_name_and_those_out_of_service_or_lacking_tools_are_left_out() -> None:
    devices = [
        view("b"),
        view("a"),
        view("c", AdminState.CORDONED),
        view("d", tools=frozenset()),
        view("e", AdminState.REVOKED),
        view("db", role="db"),
    ]
    found, left = fanout.targets(spec().nodes[0], devices)
    assert [t.name for t in found] == ["a", "b"]
    assert left == [
        {"device": "c", "reason": "it was cordoned when the node became ready"},
        {"device": "d", "reason": "it has no tool shell.run"},
    ]


def test_named_devices_fan_out_in_their_order_by_name_or_id_and_unknown_ones_are_left_out() -> None:
    found, left = fanout.targets(spec(devices=["c", "dev_a", "gone", "a"]).nodes[0], [view("a"), view("c")])
    assert [t.name for t in found] == ["c", "a"]  # `a` named twice (by id, by name) runs once
    assert left == [{"device": "gone", "reason": "no such device now (revoked, renamed or never enrolled)"}]


def test_canaries_go_first_then_the_rest_within_max_parallel() -> None:
    run, units = started(6, canary=2, max_parallel=3)
    assert ready(run, units) == units[:2]
    end(run, units[0], True)
    assert ready(run, units) == [units[1]]  # the other canary still runs
    end(run, units[1], True)
    assert ready(run, units) == units[2:5]  # three at once, no more
    end(run, units[2], True)
    assert ready(run, units) == units[3:6]


def test_a_failure_budget_of_k_tolerates_fewer_than_k_failures() -> None:
    run, units = started(4, failure_budget=2)
    for unit, ok in zip(units, (False, True, True, True), strict=True):
        end(run, unit, ok)
    rec = run.nodes["x"]
    assert (rec.state, rec.error) == (NodeState.SUCCEEDED, None)
    assert sorted(rec.output) == ["w1", "w2", "w3"]


def test_a_rollout_that_succeeded_nowhere_fails_even_within_its_budget() -> None:
    run, units = started(1, failure_budget=3)
    end(run, units[0], False)
    assert (run.nodes["x"].state, (run.nodes["x"].error or {})["code"]) == (NodeState.FAILED, "fan_out_failed")


def test_a_node_with_no_matching_device_fails_no_matching_device() -> None:
    dag = spec()
    run = TaskRun("t", dag.nodes, dag.edges)
    run.start(0.0)
    run.fan_out("x", [], [{"device": "w0", "reason": "it was stopped when the node became ready"}], 0.0)
    rec = run.nodes["x"]
    assert (rec.state, (rec.error or {})["code"]) == (NodeState.FAILED, "no_matching_device")
    assert "w0: it was stopped" in (rec.error or {})["message"]
    assert run.state.terminal


def test_the_output_map_is_read_by_device_names_holding_dots_and_dashes() -> None:
    outcome = {"output": {"web-1.example.com": {"stdout": "ok\n"}, "db": {"n": [1, 2]}}, "results": []}
    look = {"x": outcome}.get
    assert templates.resolve("${nodes.x.output.web-1.example.com.stdout}", look) == "ok\n"
    assert templates.resolve('${nodes.x.output["web-1.example.com"].stdout}', look) == "ok\n"
    assert templates.resolve("${nodes.x.output.db.n[1]}", look) == 2


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 8),
    canary=st.integers(0, 3),
    most=st.one_of(st.none(), st.integers(1, 3)),
    budget=st.one_of(st.none(), st.integers(1, 3)),
    outcomes=st.lists(st.booleans(), min_size=8, max_size=8),
    order=st.randoms(use_true_random=False),
)
def test_every_rollout_ends_by_its_rules_whatever_its_children_do(
    n: int, canary: int, most: int | None, budget: int | None, outcomes: list[bool], order: Any
) -> None:
    options: dict[str, Any] = {"canary": canary}
    if most is not None:
        options["max_parallel"] = most
    if budget is not None:
        options["failure_budget"] = budget
    run, units = started(n, **options)
    ends = 0
    while waiting := ready(run, units):
        assert most is None or sum(run.children[u].state in fanout.ACTIVE for u in units) <= most
        unit = order.choice(waiting)
        end(run, unit, outcomes[units.index(unit)])
        ends += 1
    states = [run.children[u].state for u in units]
    assert all(s.terminal for s in states) and run.nodes["x"].state.terminal
    failed = states.count(NodeState.FAILED)
    first = states[: min(canary, n)]
    halted = NodeState.FAILED in first or (budget is not None and failed >= budget)
    assert (NodeState.SKIPPED in states) <= halted  # skipped only by a halt
    ok = not halted and states.count(NodeState.SUCCEEDED) > 0 and (failed == 0 or budget is not None)
    assert (run.nodes["x"].state is NodeState.SUCCEEDED) == ok
    assert ends == n - states.count(NodeState.SKIPPED)  # every child ran once, or was skipped
