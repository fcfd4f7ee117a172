"""Options of the deterministic simulation (tests/sim).

pytest tests/sim                     # the seed sweep (SEEDS seeds, in CHUNKS tests for xdist)
pytest tests/sim --seed 1234         # replay one seed: its whole trace is printed on failure
pytest tests/sim --sim-seeds 20000   # a longer sweep
pytest tests/sim --sim-first 50000   # a sweep starting elsewhere
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sim", "deterministic simulation")
    group.addoption("--seed", type=int, default=None, help="replay one simulation seed")
    group.addoption("--sim-seeds", type=int, default=None, help="how many seeds the sweep runs")
    group.addoption("--sim-first", type=int, default=0, help="the sweep's first seed")
