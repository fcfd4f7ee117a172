"""The agent's reconnect schedule (SPEC section 4): capped exponential backoff with full jitter,
a 2 s cap while an outage is young so a restarted orchestrator is found within about a second,
and the SPEC's 30 s cap once the outage has lasted long enough to be more than a restart."""

from __future__ import annotations

import pytest

from device_agent.reconnect import BASE_S, FAST_CAP_S, FAST_WINDOW_S, SLOW_CAP_S, Backoff


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_delays_double_from_half_a_second_up_to_the_fast_cap_while_the_outage_is_young() -> None:
    clock = Clock()
    backoff = Backoff(rng=lambda: 1.0, clock=clock)
    delays = []
    for _ in range(6):
        delays.append(backoff.next_delay())
        clock.now += delays[-1]
    assert delays == [BASE_S, 1.0, FAST_CAP_S, FAST_CAP_S, FAST_CAP_S, FAST_CAP_S]


def test_after_the_fast_window_the_cap_is_thirty_seconds() -> None:
    clock = Clock()
    backoff = Backoff(rng=lambda: 1.0, clock=clock)
    for _ in range(8):
        assert backoff.next_delay() <= FAST_CAP_S
    clock.now += FAST_WINDOW_S - 0.01
    assert backoff.next_delay() == FAST_CAP_S
    clock.now += 0.02
    assert backoff.cap() == SLOW_CAP_S
    assert backoff.next_delay() == SLOW_CAP_S
    clock.now += 3600
    assert backoff.next_delay() == SLOW_CAP_S  # capped, however long it lasts


def test_the_slow_cap_is_still_reached_by_doubling() -> None:
    clock = Clock()
    backoff = Backoff(rng=lambda: 1.0, clock=clock)
    backoff.next_delay()
    clock.now += FAST_WINDOW_S + 1
    assert [backoff.next_delay() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 16.0, SLOW_CAP_S]


def test_full_jitter_draws_each_delay_uniformly_below_its_cap() -> None:
    draws = iter([0.0, 0.5, 0.25, 0.999])
    backoff = Backoff(rng=lambda: next(draws), clock=Clock())
    assert [backoff.next_delay() for _ in range(4)] == [0.0, 0.5, 0.25 * 2.0, pytest.approx(0.999 * 2.0)]


def test_reset_after_a_stable_session_starts_the_next_outage_fresh() -> None:
    clock = Clock()
    backoff = Backoff(rng=lambda: 1.0, clock=clock)
    for _ in range(10):
        backoff.next_delay()
    clock.now += FAST_WINDOW_S + 1
    assert backoff.next_delay() == SLOW_CAP_S
    backoff.reset()
    assert backoff.cap() == FAST_CAP_S
    assert backoff.next_delay() == BASE_S
    clock.now += FAST_WINDOW_S / 2
    assert backoff.next_delay() == 1.0  # the window counts from the new outage's first failure
