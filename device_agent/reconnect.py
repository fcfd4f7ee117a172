"""When to try the orchestrator again after a failed or lost connection (SPEC section 4).

Capped exponential backoff with full jitter: the k-th retry of an outage waits a uniform time in
`[0, min(cap, BASE_S * 2**k)]`. The cap is `FAST_CAP_S` for the first `FAST_WINDOW_S` of an outage
and `SLOW_CAP_S` after that. The common outage is an orchestrator restarting (a deploy, a crash,
a failover), which is back within seconds: a 30 s cap would leave agents idle for half a minute
after it returns. A 2 s cap finds it within about a second on average while spreading a whole
fleet's reconnects over two seconds (no thundering herd); an outage that outlasts the window
falls back to the SPEC's 30 s cap, so a long one costs the server next to nothing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

BASE_S = 0.5
FAST_CAP_S = 2.0
FAST_WINDOW_S = 120.0
SLOW_CAP_S = 30.0


class Backoff:
    """Delays between connection attempts; `reset()` once a session has proved stable."""

    def __init__(self, rng: Callable[[], float] = random.random, clock: Callable[[], float] = time.monotonic) -> None:
        self._rng = rng
        self._clock = clock
        self._failures = 0
        self._outage_since: float | None = None

    def reset(self) -> None:
        """A session stayed up long enough: the next failure starts a new outage."""
        self._failures = 0
        self._outage_since = None

    def cap(self) -> float:
        """The current upper bound of one delay."""
        if self._outage_since is None:
            return FAST_CAP_S
        return FAST_CAP_S if self._clock() - self._outage_since < FAST_WINDOW_S else SLOW_CAP_S

    def next_delay(self) -> float:
        """How long to wait before the next attempt (call once per failed attempt)."""
        if self._outage_since is None:
            self._outage_since = self._clock()
        high = min(self.cap(), BASE_S * 2.0 ** min(self._failures, 30))
        self._failures += 1
        return self._rng() * high
