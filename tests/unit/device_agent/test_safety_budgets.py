"""Issue 18: the counting of the safety budgets (sliding window, consecutive outcomes) with an
injected clock, and the kill-switch file."""

from __future__ import annotations

from pathlib import Path

from device_agent.budgets import Breach, SafetyBudgets
from device_agent.killswitch import KillSwitch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def destructive(b: SafetyBudgets) -> Breach | None:
    refused = b.refusal(read_only=False, destructive=True)
    if refused is None:
        b.start(destructive=True)
    return refused


def test_the_window_admits_n_destructive_actions_per_sliding_minute_and_refuses_the_next() -> None:
    clock = Clock()
    seen: list[Breach] = []
    b = SafetyBudgets(destructive_per_minute=3, clock=clock)
    b.on_breach = seen.append
    for _ in range(3):
        assert destructive(b) is None
        clock.now += 10
    breach = destructive(b)  # 4th within 30 s
    assert breach is not None and breach.budget == "destructive_per_minute" and breach.limit == 3
    assert seen == [breach]
    message = breach.refusal("files.write")
    assert "destructive_per_minute" in message and "limit 3" in message and "uncordon" in message


def test_old_actions_leave_the_window_after_sixty_seconds() -> None:
    clock = Clock()
    b = SafetyBudgets(destructive_per_minute=2, clock=clock)
    assert destructive(b) is None  # t=0
    clock.now += 59
    assert destructive(b) is None  # t=59
    clock.now += 1  # t=60: the first is out of the window, the second is not
    assert destructive(b) is None
    clock.now += 0.5
    assert destructive(b) is not None


def test_a_tripped_budget_refuses_actions_but_not_reads_until_reset() -> None:
    clock = Clock()
    b = SafetyBudgets(destructive_per_minute=1, clock=clock)
    assert destructive(b) is None
    assert destructive(b) is not None
    clock.now += 3600  # time alone does not lift a trip
    assert b.refusal(read_only=False, destructive=False) is not None
    assert b.refusal(read_only=True, destructive=False) is None
    b.reset()
    assert destructive(b) is None


def test_non_destructive_actions_and_an_unset_budget_are_not_counted() -> None:
    b = SafetyBudgets(destructive_per_minute=1, clock=Clock())
    for _ in range(5):
        assert b.refusal(read_only=False, destructive=False) is None
        b.start(destructive=False)
    off = SafetyBudgets(clock=Clock())
    for _ in range(100):
        assert destructive(off) is None


def test_m_consecutive_bad_outcomes_trip_and_anything_else_ends_the_streak() -> None:
    seen: list[Breach] = []
    b = SafetyBudgets(consecutive_bad=3)
    b.on_breach = seen.append
    b.outcome("failure", "policy_denied")
    b.outcome("uncertain", "uncertain")
    b.outcome("success", None)  # ends the streak
    b.outcome("failure", "approval_denied")
    b.outcome("failure", "budget_exceeded")  # neither counts nor ends it
    b.outcome("failure", "policy_denied")
    assert b.tripped is None
    b.outcome("failure", "tool_error")  # another error ends it too
    for _ in range(3):
        b.outcome("failure", "policy_denied")
    assert b.tripped is not None and b.tripped.budget == "consecutive_bad_outcomes" and b.tripped.limit == 3
    assert len(seen) == 1
    b.outcome("failure", "policy_denied")
    assert len(seen) == 1  # reported once per trip
    assert b.refusal(read_only=False, destructive=False) is b.tripped
    b.reset()
    assert b.tripped is None and b.streak == 0


def test_the_kill_switch_file_turns_it_on_and_off(tmp_path: Path) -> None:
    switch = KillSwitch(tmp_path / "dd" / "kill-switch")
    assert not switch.is_on() and switch.status() == "off"
    switch.turn(True)
    assert switch.is_on() and "exists" in switch.status()
    switch.turn(True)  # idempotent
    switch.turn(False)
    switch.turn(False)
    assert not switch.is_on()
    assert KillSwitch(None, configured=True).is_on()
    assert not KillSwitch(None).is_on()
