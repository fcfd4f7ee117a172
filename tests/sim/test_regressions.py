"""Seeds on which the simulator found a bug, kept as fixed tests (see the notes on each).

A seed replays one world exactly as long as the simulator stays the same; when the simulator
learns new faults or behaviours, an old seed draws another world. So each bug is also pinned by a
small test of its own (below, and in tests/unit/engine/test_replanning.py)."""

from __future__ import annotations

import pytest

from tests.sim.test_sim import explain
from tests.sim.world import simulate


@pytest.mark.parametrize(
    "seed",
    [
        # A held failure (waiting for its re-plan) read as a final failure to the DAG rules: when
        # another predecessor of its successor finished, or at a restart (`TaskRun.start`), the
        # successor was skipped before the planner could edit it (domain/run.py, _StateView).
        8,
        # A held failure whose successors were all decided already (skipped by other edges), or
        # that had none, was not held again after a restart: the rebuilt engine finished the task
        # without the re-plan the live one was waiting for (engine/restore.py, _held_when_stored).
        13,
        161,
        362,
        # Applying a re-plan's edits asked the planner about the same failure again (a wasted
        # round of the task's re-plan budget, and a model call); and when the budget ran out,
        # failures still waiting for an answer kept the task open although a restart from the
        # store would let them go at once (engine/llm_work.py, replan_done).
        1000330,
        1000858,
        # A fan-out child whose rollout halted while it ran went back to ready when its attempt
        # failed retry-safe (a stop ended it), and waited for its queue timeout; a restart from
        # the store skipped it, so memory and store disagreed (domain/run.py, attempt_ended;
        # tests/unit/engine/test_fanouts.py).
        1000641,
        # An agent that accepted a batch, crashed, and lost its redelivery too (a relay dropped)
        # idled for ever while the engine held the batch open: it re-sent only batches never
        # accepted, and a wait for an approval stops the deadline (engine/fleet.py,
        # _reconcile_batch; tests/unit/engine/test_guarantees.py).
        1000661,
    ],
)
def test_regression_seed(seed: int) -> None:
    outcome = simulate(seed)
    assert outcome.ok, explain(outcome)


def test_a_held_failure_does_not_skip_its_successor() -> None:
    """Seed 8 in miniature, on the domain alone: c needs a and b to succeed; a fails and is held
    for its re-plan; b then succeeds. c must stay pending (the planner may still edit it), and
    is skipped only once a's failure is released."""
    from orchestrator.domain.model import EdgeSpec, NodeSpec, NodeState
    from orchestrator.domain.run import AttemptOutcome, TaskRun

    specs = [NodeSpec.model_validate({"id": n, "commands": [{"tool": "sim.act"}]}) for n in "abc"]
    edges = [EdgeSpec.model_validate({"from": s, "to": "c"}) for s in "ab"]
    run = TaskRun("t", specs, edges)
    run.hold_failures = True
    run.start(0.0)
    run.mark_running("a")
    run.mark_running("b")
    run.attempt_ended("a", AttemptOutcome(False, error_code="tool_error", tool_hints=((False, False),)), 1.0, 0.5)
    assert run.held == {"a"}
    run.attempt_ended("b", AttemptOutcome(True), 2.0, 0.5)
    assert run.nodes["c"].state is NodeState.PENDING
    run.release("a", 3.0)
    assert run.states()["c"] is NodeState.SKIPPED
