"""The sharded-ownership prototype (tests/sim/shards.py, docs/scaling.md): its seed sweep, its
rules one by one, and the throughput it gives as shards are added.

pytest tests/sim/test_shards.py                  # the sweep (SEEDS seeds) and the rest
pytest tests/sim/test_shards.py --seed 1234      # replay one seed: its trace is printed on failure
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.sim.shards import (
    STORM_SEEDS,
    AddTask,
    Ask,
    Claim,
    Costs,
    DeviceRow,
    LeaseLost,
    Open,
    Outcome,
    Refused,
    RequestRow,
    Store,
    TaskRow,
    shard_of,
    simulate,
    throughput,
)
from tests.sim.sweep import chunk_seeds, sweep

ROOT = Path(__file__).resolve().parents[2]
SEEDS = 1000  # half ordinary seeds (some faults, each at some rate), half storms (every fault)
CHUNKS = 10


def explain(outcome: Outcome) -> str:
    return (
        f"shard simulation seed {outcome.seed} failed: {outcome.error}\n"
        f"replay: pytest tests/sim/test_shards.py --seed {outcome.seed}\n"
        f"--- the last events before it (virtual seconds since start) ---\n{outcome.trace}"
    )


def _chunk(config: pytest.Config, index: int) -> range:
    return chunk_seeds(config, index, seeds=SEEDS, chunks=CHUNKS, storm_seeds=STORM_SEEDS)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_shard_seed_sweep(request: pytest.FixtureRequest, chunk: int) -> None:
    """Every seed keeps every invariant: nothing acknowledged lost, no node run twice, every task
    ended by its DAG's rules, claims moved only off dead claims, only live owners writing, and
    each shard's memory what a rebuild from the store would give."""
    sweep(request, lambda: _chunk(request.config, chunk), simulate, explain, chunk)


def test_a_shard_seed_replays_exactly() -> None:
    """The same seed gives the same trace (hash of every event), in this process and in another
    with another string hash seed; another seed gives another."""
    for seed in (7, STORM_SEEDS + 7):
        first, again, other = simulate(seed), simulate(seed), simulate(seed + 1)
        assert first.events > 50
        assert (first.digest, first.commits) == (again.digest, again.commits)
        assert first.digest != other.digest
        code = f"from tests.sim.shards import simulate; print(simulate({seed}).digest)"
        env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
        elsewhere = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert elsewhere.stdout.strip() == first.digest, elsewhere.stderr[-2000:]


def test_the_sharded_engine_runs_its_tasks_to_their_end() -> None:
    """The sweep proves something only if work gets done: tasks are admitted and nodes run."""
    for seed in (7, STORM_SEEDS + 7):
        outcome = simulate(seed)
        assert outcome.ok, explain(outcome)
        assert outcome.tasks >= 4 and outcome.nodes_done >= 8 and outcome.commits > 20, outcome


@functools.cache
def _coverage() -> Counter[str]:
    seen: Counter[str] = Counter()
    for seed in [*range(50), *range(STORM_SEEDS, STORM_SEEDS + 50)]:
        outcome = simulate(seed)
        assert outcome.ok, explain(outcome)
        seen += outcome.seen
    return seen


def test_the_sharded_runs_reach_every_fault_and_ownership_path() -> None:
    """Over 100 seeds: replicas crash (a commit in flight sometimes landing after), leases expire
    under leaders that go on writing and are refused, the store fails commits, claims of dead
    shards' devices race and some lose, devices come back home, open attempts move with their
    device, and nodes run on devices of their own shard and of others."""
    seen = _coverage()
    wanted = [
        "replica crash",
        "commit landed after a crash",
        "lease expired under its leader",
        "stale leader's commit refused",
        "store failure",
        "device claimed",
        "device of another shard claimed",
        "claim lost a race",
        "device handed back home",
        "open attempt adopted",
        "local attempt",
        "remote attempt",
    ]
    missing = [w for w in wanted if not seen[w]]
    assert not missing, f"not reached: {missing}; reached: {dict(seen)}"


# ---------------------------------------------------------------------- the rules, one by one


def _store(shards: int = 3) -> tuple[Store, list[float]]:
    now = [100.0]
    store = Store(lambda: now[0], shards)
    store.devices["d"] = DeviceRow(home=0, owner=0, owner_fence=1)
    return store, now


def test_a_claim_from_a_stale_view_of_a_device_is_refused() -> None:
    """Shard 0 died holding `d`; shard 0's next leader re-claims it; shard 2 had read the dead
    claim before that and tries to take it from there: the compare-and-set refuses it (the live
    claim stays), and the device stays with the one owner."""
    store, now = _store()
    assert store.take(0, "A#1", 3.0) == 1
    now[0] += 5.0  # A#1 is gone: its lease expired
    seen = Claim("d", 0, 1)  # what shard 2 read, a dead claim
    assert store.take(0, "B#1", 3.0) == 2 and store.take(2, "C#1", 3.0) == 1
    assert store.commit(0, "B#1", 2, [Claim("d", 0, 1)]) == {"d": True}
    assert store.commit(2, "C#1", 1, [seen]) == {"d": False}
    assert (store.devices["d"].owner, store.devices["d"].owner_fence) == (0, 2)


def test_a_live_claim_cannot_be_taken() -> None:
    store, _now = _store()
    assert store.take(0, "A#1", 3.0) == 1 and store.take(1, "B#1", 3.0) == 1
    assert store.commit(1, "B#1", 1, [Claim("d", 0, 1)]) == {"d": False}
    assert store.devices["d"].owner == 0


def test_a_leader_whose_lease_moved_on_writes_nothing() -> None:
    """The lease expired under shard 0's leader and another replica took it: the old leader's
    commit is refused whole, even the parts that would fit."""
    store, _now = _store(1)
    assert store.take(0, "A#1", 3.0) == 1
    store.expire(0)
    assert store.take(0, "B#1", 3.0) == 2
    task = TaskRow("t", shard_of("t", 1), {"n": ()})
    with pytest.raises(LeaseLost):
        store.commit(0, "A#1", 1, [AddTask(task)])
    assert "t" not in store.tasks


def test_only_the_devices_owner_opens_an_attempt_on_it() -> None:
    """Shard 1 holds a live lease but not the device's claim: its attempt on the device is refused
    and nothing of its commit stays (the request it asked in the same commit is undone)."""
    store, _now = _store(2)
    assert store.take(0, "A#1", 3.0) == 1 and store.take(1, "B#1", 3.0) == 1
    task_id = next(t for t in (f"t{i}" for i in range(50)) if shard_of(t, 2) == 1)
    store.commit(1, "B#1", 1, [AddTask(TaskRow(task_id, 1, {"n": ()}))])
    ask = Ask(RequestRow("r1", task_id, "n", "d"))
    with pytest.raises(Refused):
        store.commit(1, "B#1", 1, [ask, Open("b1", "r1", 1)])
    assert "r1" not in store.requests and store.nodes[(task_id, "n")] == "pending"
    assert store.devices["d"].batch is None


# ---------------------------------------------------------------------- what it would give


def _rate(n: int, costs: Costs) -> float:
    outcome = throughput(n, costs, devices=200, in_flight=100, remote_share=0.1, seconds=4.0)
    return outcome.nodes_done / outcome.virtual_s


# A leader's costs 40 times the measured ones (tests/sim/shards.py, MEASURED): the same ratios, a
# fortieth of the events to simulate.
SLOW = Costs(step_s=40 * 127e-6, input_s=40 * 56e-6, exec_s=(0.005, 0.02), net_s=0.001)
# And a store that serves one commit at a time, 4 ms each plus 4 ms a row (scaled as well).
CAPPED = Costs(
    step_s=SLOW.step_s, input_s=SLOW.input_s, db_commit_s=40 * 100e-6, db_op_s=40 * 100e-6, exec_s=(0.005, 0.02)
)


def test_shards_add_throughput_until_the_store_is_the_limit() -> None:
    """With each shard's leader on its own replica, two shards give close to twice one, four close
    to twice two; with a store that serves a fixed number of row writes a second, adding shards
    stops helping once the store is saturated (virtual time: the same figures on any machine)."""
    one, two, four = (_rate(n, SLOW) for n in (1, 2, 4))
    assert two > 1.6 * one and four > 1.5 * two, (one, two, four)
    capped_two, capped_four = _rate(2, CAPPED), _rate(4, CAPPED)
    assert capped_four < 1.25 * capped_two, (capped_two, capped_four)
