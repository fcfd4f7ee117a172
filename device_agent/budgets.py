"""Per-device safety budgets set by the device owner.

Two budgets, each off when its limit is 0:

- `max_destructive_per_minute` (N): at most N destructive actions (tools whose annotations say
  `destructive`) may start in any 60-second window (a sliding window, not calendar minutes). The
  (N+1)-th is refused `budget_exceeded` without running.
- `max_consecutive_bad_outcomes` (M): at most M outcomes in a row that are `uncertain`,
  `policy_denied` or `approval_denied`; the M-th trips the budget. Any other outcome (a success,
  another error) ends the streak; a command refused by a budget neither counts nor ends it.

A breach trips the budgets: from then on every tool that is not read-only is refused
`budget_exceeded` (read-only tools keep working) and the agent tells the orchestrator
(`safety_breach`), which cordons the device with the breach as its reason. An operator's uncordon
sends `budget_reset`, which clears the window, the streak and the trip; so does restarting the
agent (the counters live in memory; the orchestrator's cordon is durable).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from protocol.messages import SafetyBudget

WINDOW_S = 60.0
BAD_STATUSES = frozenset({"uncertain"})
BAD_CODES = frozenset({"uncertain", "policy_denied", "approval_denied"})
NEUTRAL_CODES = frozenset({"budget_exceeded"})


@dataclass(frozen=True)
class Breach:
    budget: SafetyBudget
    limit: int
    detail: str

    def refusal(self, tool: str) -> str:
        """The `budget_exceeded` message for a refused command: which budget, its limit, the way out."""
        return (
            f"'{tool}' was refused: this device's safety budget {self.budget} (limit {self.limit}) was "
            f"exceeded ({self.detail}). The device is cordoned and refuses actions until an operator "
            "uncordons it ('orrery devices uncordon <device>' or POST /v1/devices/{id}/uncordon), which "
            "resets the budget, or the device owner restarts the agent; do not retry this command, find "
            "out first why so many actions were attempted or refused"
        )


class SafetyBudgets:
    def __init__(
        self,
        destructive_per_minute: int = 0,
        consecutive_bad: int = 0,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = WINDOW_S,
    ) -> None:
        self.destructive_per_minute = destructive_per_minute
        self.consecutive_bad = consecutive_bad
        self.clock = clock
        self.window_s = window_s
        self.started: deque[float] = deque()  # when each destructive action in the window started
        self.streak = 0
        self.tripped: Breach | None = None
        self.on_breach: Callable[[Breach], None] | None = None  # the agent tells the orchestrator

    def refusal(self, read_only: bool, destructive: bool) -> Breach | None:
        """The breach that refuses this command now, if any (a new breach trips the budgets)."""
        if self.tripped is not None and not read_only:
            return self.tripped
        if destructive and self.destructive_per_minute > 0:
            now = self.clock()
            self._prune(now)
            if len(self.started) >= self.destructive_per_minute:
                first = self.started[0]
                return self._trip(
                    Breach(
                        "destructive_per_minute",
                        self.destructive_per_minute,
                        f"{len(self.started)} destructive actions started in the last {self.window_s:g} s, the "
                        f"oldest {now - first:.0f} s ago",
                    )
                )
        return None

    def start(self, destructive: bool) -> None:
        """A command passed every check and runs now."""
        if destructive and self.destructive_per_minute > 0:
            self.started.append(self.clock())

    def outcome(self, status: str, code: str | None) -> None:
        """Count a command's outcome towards the consecutive budget."""
        if code in NEUTRAL_CODES:
            return
        if status not in BAD_STATUSES and code not in BAD_CODES:
            self.streak = 0
            return
        self.streak += 1
        if self.consecutive_bad > 0 and self.streak >= self.consecutive_bad and self.tripped is None:
            self._trip(
                Breach(
                    "consecutive_bad_outcomes",
                    self.consecutive_bad,
                    f"{self.streak} outcomes in a row were uncertain, policy_denied or approval_denied "
                    f"(the last: {code or status})",
                )
            )

    def reset(self) -> None:
        self.started.clear()
        self.streak = 0
        self.tripped = None

    def _trip(self, breach: Breach) -> Breach:
        self.tripped = breach
        if self.on_breach is not None:
            self.on_breach(breach)
        return breach

    def _prune(self, now: float) -> None:
        while self.started and now - self.started[0] >= self.window_s:
            self.started.popleft()
