"""Timers fire in time order (ties in the order they were set), only once due."""

from __future__ import annotations

from orchestrator.engine.timers import AcceptDeadline, AttemptDeadline, QueueTimeout, Sweep, Timers, Wake


def test_due_returns_what_is_due_earliest_first_and_ties_in_order_of_adding() -> None:
    timers = Timers()
    timers.add(5.0, Sweep())
    timers.add(1.0, AttemptDeadline("b2"))
    timers.add(1.0, AcceptDeadline("b1"))
    timers.add(3.0, QueueTimeout(("t", "n"), since=0.5))
    timers.add(9.0, Wake())
    assert timers.next_at() == 1.0
    assert timers.due(0.5) == []
    assert timers.due(3.0) == [
        (1.0, AttemptDeadline("b2")),
        (1.0, AcceptDeadline("b1")),
        (3.0, QueueTimeout(("t", "n"), 0.5)),
    ]
    assert timers.next_at() == 5.0 and len(timers) == 2
    assert timers.due(100.0) == [(5.0, Sweep()), (9.0, Wake())]
    assert timers.next_at() is None


def test_timers_are_values() -> None:
    """Equal timers compare equal and hash alike (a heap never compares them: ties go by order)."""
    assert {QueueTimeout(("t", "n"), 1.0), QueueTimeout(("t", "n"), 1.0)} == {QueueTimeout(("t", "n"), 1.0)}
    timers = Timers()
    timers.add(1.0, Wake())
    timers.add(1.0, Wake())
    assert len(timers.due(1.0)) == 2
