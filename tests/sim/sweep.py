"""The seed sweep both simulations run (tests/sim/test_sim.py, tests/sim/test_shards.py): seeds
cut into chunks for xdist, the first half of the chunks ordinary seeds from `--sim-first`, the
second half storms (the same count, from `storm_seeds` + `--sim-first`); `--seed` replays one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pytest


class Outcome(Protocol):
    @property
    def ok(self) -> bool: ...


def chunk_seeds(config: pytest.Config, index: int, *, seeds: int, chunks: int, storm_seeds: int) -> range:
    """The seeds of chunk `index`."""
    total = (config.getoption("--sim-seeds", default=None) or seeds) // 2
    first = config.getoption("--sim-first", default=0) or 0
    half = chunks // 2
    if index >= half:
        index, first = index - half, first + storm_seeds
    size = -(-total // half)
    return range(first + index * size, first + min(total, (index + 1) * size))


def sweep(
    request: pytest.FixtureRequest,
    seeds: Callable[[], range],
    simulate: Callable[[int], Any],
    explain: Callable[[Any], str],
    chunk: int,
) -> None:
    """Simulate every seed of the chunk (or the one `--seed`, in chunk 0); fail with the first
    seed that breaks an invariant, its trace and how to replay it."""
    seed = request.config.getoption("--seed", default=None)
    if seed is not None:
        if chunk:
            pytest.skip("replaying one seed (--seed): it runs in chunk 0")
        chosen: range | list[int] = [seed]
    else:
        chosen = seeds()
    for s in chosen:
        outcome: Outcome = simulate(s)
        if not outcome.ok:
            pytest.fail(explain(outcome), pytrace=False)
