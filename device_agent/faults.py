"""Crash points: a test hook that kills the agent at a chosen step of a batch.

Like FoundationDB's BUGGIFY, the agent's own code names the places where a crash is most
likely to break a guarantee, and a test can make it crash exactly there, for real: with
`ORRERY_AGENT_CRASH_AT=<point>[:<n>]` in its environment the agent sends itself SIGKILL the
n-th time (default 1) it passes `<point>`. No cleanup runs, nothing is flushed beyond what the
agent had already written, exactly as when the machine's power goes. The fault-matrix tests
use this interface; nothing else should.

Points, in the order a batch passes them:

- `received`: the batch is durably recorded in the ledger, `batch_accepted` not yet sent;
- `accepted`: the batch is accepted: `batch_accepted` was sent, or, for a batch that starts at
  once, left to ride with its results (`device_agent.agent.ACCEPT_AFTER_S`); nothing has run;
- `call_started`: the ledger's start of a command is committed, the tool has not run;
- `call_done`: the tool returned, its result is not yet recorded;
- `finished`: the batch's results are committed (ledger and outbox), `result_batch` not sent;
- `sent`: `result_batch` was sent, the server's acknowledgement has not arrived.

The variable is read once, at start. Unset, `reach()` is one attribute test.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

ENV = "ORRERY_AGENT_CRASH_AT"
POINTS = ("received", "accepted", "call_started", "call_done", "finished", "sent")

log = logging.getLogger("orrery.agent")


class CrashPoints:
    def __init__(self, point: str | None = None, nth: int = 1) -> None:
        if point is not None and point not in POINTS:
            raise ValueError(f"{ENV}: unknown crash point {point!r}; the points are {', '.join(POINTS)}")
        if nth < 1:
            raise ValueError(f"{ENV}: the count after ':' must be 1 or more, got {nth}")
        self.point = point
        self.nth = nth
        self._passed = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CrashPoints:
        """`<point>[:<n>]` from ORRERY_AGENT_CRASH_AT, or no crash point when it is unset or empty."""
        value = environ.get(ENV, "").strip()
        if not value:
            return cls()
        point, _, count = value.partition(":")
        try:
            nth = int(count) if count else 1
        except ValueError:
            raise ValueError(f"{ENV}: expected <point>[:<n>], got {value!r}") from None
        return cls(point, nth)

    def reach(self, point: str) -> None:
        """Called at each point: SIGKILL this process if it is the armed point's n-th pass."""
        if point != self.point:
            return
        self._passed += 1
        if self._passed == self.nth:
            log.warning("crash point %s reached (pass %d): killing the agent with SIGKILL", point, self._passed)
            os.kill(os.getpid(), signal.SIGKILL)
