"""The pure task state machine: outcomes, retries, cancellation, and a property test over random DAGs."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain import dag
from orchestrator.domain.model import EdgeSpec, NodeSpec, NodeState, TaskState
from orchestrator.domain.run import AttemptOutcome, TaskRun


def nodespec(node_id: str, max_attempts: int = 1) -> NodeSpec:
    return NodeSpec.model_validate(
        {"id": node_id, "commands": [{"tool": "t.x"}], "retry": {"max_attempts": max_attempts, "backoff_s": 1}}
    )


def edge(a: str, b: str, on: str = "success") -> EdgeSpec:
    return EdgeSpec.model_validate({"from": a, "to": b, "on": on})


def ok() -> AttemptOutcome:
    return AttemptOutcome(True, output="out")


def fail(started: bool = True, safe_hints: bool = False) -> AttemptOutcome:
    return AttemptOutcome(
        False, error_code="tool_error", error_message="x", started=started, tool_hints=((safe_hints, False),)
    )


def test_a_handled_failure_lets_the_task_succeed() -> None:
    run = TaskRun("t", [nodespec("a"), nodespec("fix")], [edge("a", "fix", "failure")])
    run.start(0)
    run.mark_running("a")
    run.attempt_ended("a", fail(), 1, 0.5)
    run.mark_running("fix")
    run.attempt_ended("fix", ok(), 2, 0.5)
    assert run.state is TaskState.SUCCEEDED


def test_an_unhandled_failure_fails_the_task_and_skips_dependents() -> None:
    run = TaskRun("t", [nodespec("a"), nodespec("b")], [edge("a", "b")])
    run.start(0)
    run.mark_running("a")
    run.attempt_ended("a", fail(), 1, 0.5)
    assert run.nodes["b"].state is NodeState.SKIPPED
    assert run.state is TaskState.FAILED


def test_a_retry_safe_failure_goes_back_to_ready_after_backoff() -> None:
    run = TaskRun("t", [nodespec("a", max_attempts=3)], [])
    run.start(0)
    run.mark_running("a")
    run.attempt_ended("a", fail(safe_hints=True), 10.0, jitter=0.5)
    rec = run.nodes["a"]
    assert rec.state is NodeState.READY
    assert rec.not_before == 10.5  # min(60, 1 * 2**0) * 0.5


def test_a_retry_waits_out_its_backoff_before_its_queue_timeout_starts_counting() -> None:
    """Issue 12, defect 9: `ready_since` (what the queue timeout counts from) is the end of the
    backoff, so a backoff longer than queue_timeout_s cannot fail the node before it may retry."""
    spec = NodeSpec.model_validate(
        {
            "id": "a",
            "commands": [{"tool": "t.x"}],
            "queue_timeout_s": 5,
            "retry": {"max_attempts": 2, "backoff_s": 100, "backoff_max_s": 100},
        }
    )
    run = TaskRun("t", [spec], [])
    run.start(0)
    run.mark_running("a")
    run.attempt_ended("a", fail(safe_hints=True), 10.0, jitter=0.5)
    rec = run.nodes["a"]
    assert rec.not_before == 60.0
    assert rec.ready_since == rec.not_before


def test_an_attempt_that_never_started_is_placed_again_without_spending_a_try() -> None:
    run = TaskRun("t", [nodespec("a", max_attempts=1)], [])
    run.start(0)
    run.mark_running("a")
    run.attempt_ended("a", fail(started=False), 3.0, jitter=0.5)
    rec = run.nodes["a"]
    assert rec.state is NodeState.READY
    assert (rec.attempts, rec.tries) == (1, 0)
    assert rec.ready_since == 0  # schedule-to-start: its queue timeout still counts from the start
    run.mark_running("a")
    run.attempt_ended("a", fail(started=True, safe_hints=True), 5.0, jitter=0.5)
    assert rec.state is NodeState.FAILED  # the one try it had


def test_a_side_effecting_failure_is_not_retried() -> None:
    run = TaskRun("t", [nodespec("a", max_attempts=3)], [])
    run.start(0)
    run.mark_running("a")
    run.attempt_ended("a", fail(started=True, safe_hints=False), 1, 0.5)
    assert run.nodes["a"].state is NodeState.FAILED


def test_cancel_cancels_waiting_nodes_and_ends_when_running_ones_report() -> None:
    run = TaskRun("t", [nodespec("a"), nodespec("b"), nodespec("c")], [edge("a", "c")])
    run.start(0)
    run.mark_running("a")
    run.cancel(1)
    assert run.nodes["b"].state is NodeState.CANCELLED
    assert run.nodes["c"].state is NodeState.CANCELLED
    assert run.state is TaskState.RUNNING  # a is still running on its device
    run.attempt_ended("a", AttemptOutcome(False, error_code="cancelled", cancelled=True), 2, 0.5)
    assert run.state is TaskState.CANCELLED


# ---------------------------------------------------------------- property test


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[list[NodeSpec], list[EdgeSpec]]:
    n = draw(st.integers(min_value=1, max_value=50))
    nodes = [nodespec(f"n{i}", draw(st.integers(1, 3))) for i in range(n)]
    edges = []
    for j in range(1, n):
        for i in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            edges.append(edge(f"n{i}", f"n{j}", draw(st.sampled_from(["success", "failure", "always"]))))
    return nodes, edges


@settings(max_examples=200, deadline=None)
@given(shape=random_dags(), data=st.data())
def test_random_runs_terminate_respect_edges_and_never_rerun_unsafely(
    shape: tuple[list[NodeSpec], list[EdgeSpec]], data: st.DataObject
) -> None:
    nodes, edges = shape
    run = TaskRun("t", nodes, edges)
    graph = dag.Graph.build([n.id for n in nodes], edges)
    now = 0.0
    run.start(now)
    runs: dict[str, int] = {}
    tries: dict[str, int] = {}  # attempts that may have run on a device
    last_failure_safe: dict[str, bool] = {}
    cancel_at = data.draw(st.one_of(st.none(), st.integers(0, 60)), label="cancel_at")
    steps = 0
    while True:
        steps += 1
        assert steps < 1000, "the task did not terminate"
        if cancel_at is not None and steps == cancel_at:
            run.cancel(now)
        ready = [k for k, r in run.nodes.items() if r.state is NodeState.READY]
        if not ready:
            break
        node_id = data.draw(st.sampled_from(sorted(ready)), label="dispatch")
        # Never run a node whose edges are not all satisfied.
        for e in graph.incoming[node_id]:
            assert dag.edge_status(e, run.nodes[e.source].state) is True
        if node_id in runs:
            assert last_failure_safe.get(node_id), f"{node_id} re-ran without a retry-safe reason"
        assert not run.cancel_requested, "a node was dispatched after cancellation"
        runs[node_id] = runs.get(node_id, 0) + 1
        run.mark_running(node_id)
        now += 1
        kind = data.draw(st.sampled_from(["ok", "fail_safe", "fail_unsafe", "not_started"]), label="outcome")
        outcome: Any
        if kind == "ok":
            outcome = ok()
        elif kind == "fail_safe":
            outcome = fail(started=True, safe_hints=True)
        elif kind == "fail_unsafe":
            outcome = fail(started=True, safe_hints=False)
        else:
            outcome = fail(started=False)
        last_failure_safe[node_id] = kind in ("fail_safe", "not_started")
        tries[node_id] = tries.get(node_id, 0) + (kind != "not_started")
        run.attempt_ended(node_id, outcome, now, data.draw(st.floats(0, 0.999), label="jitter"))
    assert run.state.terminal
    assert all(r.state.terminal for r in run.nodes.values())
    for node_id, count in tries.items():
        # An attempt that never started is placed again without spending a try.
        assert count <= nodes[int(node_id[1:])].retry.max_attempts


def _unsafe_shell_failure() -> AttemptOutcome:
    return AttemptOutcome(
        False,
        error_code="tool_error",
        error_message="exit 1",
        tool_hints=((False, False),),
        tools=("shell.run",),
        commands=(0,),
    )


def _shell_node(idempotent: bool) -> NodeSpec:
    return NodeSpec.model_validate(
        {
            "id": "a",
            "commands": [{"tool": "shell.run", "arguments": {"argv": ["x"]}, "idempotent": idempotent}],
            "retry": {"max_attempts": 3},
        }
    )


def test_a_command_declared_idempotent_is_retried_although_its_tool_is_not() -> None:
    run = TaskRun("t", [_shell_node(idempotent=True)], [])
    run.start(0)
    run.mark_running("a")
    run.attempt_ended("a", _unsafe_shell_failure(), 1, 0.5)
    assert run.nodes["a"].state is NodeState.READY


def test_a_failure_not_retried_with_tries_left_says_why_in_the_node_error() -> None:
    run = TaskRun("t", [_shell_node(idempotent=False)], [])
    run.start(0)
    run.mark_running("a")
    run.attempt_ended("a", _unsafe_shell_failure(), 1, 0.5)
    error = run.nodes["a"].error
    assert run.nodes["a"].state is NodeState.FAILED and error is not None
    assert "shell.run is neither read-only nor idempotent" in error["not_retried"]
    assert "idempotent: true" in error["not_retried"]


def test_a_failure_after_the_last_allowed_try_has_no_not_retried() -> None:
    run = TaskRun("t", [nodespec("a", max_attempts=1)], [])
    run.start(0)
    run.mark_running("a")
    run.attempt_ended("a", fail(), 1, 0.5)
    error = run.nodes["a"].error
    assert error is not None and "not_retried" not in error


def test_a_queue_timeout_with_tries_left_says_it_is_never_retried() -> None:
    run = TaskRun("t", [nodespec("a", max_attempts=3)], [])
    run.start(0)
    run.fail("a", "queue_timeout", "nobody came", 5)
    error = run.nodes["a"].error
    assert error is not None and error["not_retried"].startswith("not retried: no device took it")
