"""The seed sweep of the deterministic simulation (see tests/sim/world.py for the model).

Each test runs one chunk of seeds; a failing seed names itself, its violation, the last ~200
events of its trace, and the command that replays it exactly."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from tests.sim.sweep import chunk_seeds, sweep
from tests.sim.world import STORM_SEEDS, Outcome, simulate

SEEDS = 2000  # half ordinary seeds (some faults, each at some rate), half storms (all faults)
CHUNKS = 40


def explain(outcome: Outcome) -> str:
    return (
        f"simulation seed {outcome.seed} failed: {outcome.error}\n"
        f"replay: pytest tests/sim --seed {outcome.seed}\n"
        f"--- the last events before it (virtual seconds since start) ---\n{outcome.trace}"
    )


def _chunk(config: pytest.Config, index: int) -> range:
    return chunk_seeds(config, index, seeds=SEEDS, chunks=CHUNKS, storm_seeds=STORM_SEEDS)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seed_sweep(request: pytest.FixtureRequest, chunk: int) -> None:
    """Every seed of the chunk keeps every invariant, under faults and through a quiet heal."""
    sweep(request, lambda: _chunk(request.config, chunk), simulate, explain, chunk)


def test_a_seed_replays_exactly() -> None:
    """Determinism: the same seed gives the same trace (hash of every event), and another seed
    a different one."""
    first, again, other = simulate(7), simulate(7), simulate(8)
    assert first.events > 50
    assert (first.digest, first.steps) == (again.digest, again.steps)
    assert first.digest != other.digest


def test_a_seed_whose_leader_loses_its_lease_session_replays_exactly() -> None:
    """Determinism holds through the takeover from a session gone, the old engine acting on."""
    first, again = simulate(STORM_SEEDS + 3), simulate(STORM_SEEDS + 3)
    assert first.coverage["lease taken from a session gone"] and first.coverage["old engine's commit refused"]
    assert (first.digest, first.steps) == (again.digest, again.steps)


def test_the_simulated_engine_runs_its_tasks_to_their_end() -> None:
    """The sweep proves something only if its engine runs: steps are taken and tasks end (an
    engine that fails to start would leave every invariant vacuously true)."""
    for seed in (7, STORM_SEEDS + 7):
        outcome = simulate(seed)
        assert outcome.ok, explain(outcome)
        assert outcome.steps > 50 and outcome.terminal >= 1, (outcome.steps, outcome.terminal)


@functools.cache
def _coverage() -> Counter[str]:
    """The paths 150 seeds take (run once, read by the coverage tests)."""
    seen: Counter[str] = Counter()
    for seed in [*range(75), *range(STORM_SEEDS, STORM_SEEDS + 75)]:
        outcome = simulate(seed)
        assert outcome.ok, explain(outcome)
        seen += outcome.coverage
    return seen


def test_the_generated_dags_reach_every_fan_out_and_verify_path() -> None:
    """Over 150 seeds the DAGs include fan-out nodes that succeed, fail by each rule
    (a canary, the budget, any failure, no device), children skipped by a halt, and outcomes
    verified after a success and decided by a probe after an unknown one."""
    seen = _coverage()
    wanted = [
        "fan_out succeeded None",
        "fan_out failed canary_failed",
        "fan_out failed failure_budget_exhausted",
        "fan_out failed fan_out_failed",
        "fan_out failed no_matching_device",
        "child skipped",
        "verify passed after success",
        "verify failed after success",
        "verify passed after unknown",
    ]
    missing = [w for w in wanted if not seen[w]]
    assert not missing, f"not reached: {missing}; reached: {dict(seen)}"


def test_the_runs_reach_every_person_and_control_path() -> None:
    """Over the same seeds, people and controls take every path the invariants are about:
    approvals decided every way by the owner at the device and by the orchestrator (an
    operator, the expiry, a cancel), the device's own decision holding against a request that
    came second, emergency stops applied and lifted by a resume, safety budgets tripped, the
    kill switch refusing work, commands outliving a crashed agent and killed by its restart,
    takeovers by an operator applied by the device and by its owner recorded by the engine,
    schedule ticks making their tasks, results the store refused isolated (their attempt
    ended `input_refused`, memory agreeing with the store), and a leader whose lease session
    ended succeeded at once while its old engine acted on until a commit of its was refused."""
    seen = _coverage()
    wanted = [
        "approval approved by owner",
        "approval denied by owner",
        "approval approved by orchestrator",
        "approval denied by orchestrator",
        "approval expired by orchestrator",
        "approval cancelled by orchestrator",
        "approval race: the device's decision held",
        "stop applied",
        "stop lifted",
        "takeover applied",
        "owner takeover recorded",
        "safety budget tripped",
        "kill switch refused",
        "orphan",
        "orphan killed",
        "schedule tick's task",
        "input refused by the store",
        "lease taken from a session gone",
        "old engine's commit refused",
    ]
    missing = [w for w in wanted if not seen[w]]
    assert not missing, f"not reached: {missing}; reached: {dict(seen)}"
