"""A small sliding-window rate limiter keyed by client address."""

from __future__ import annotations

import time
from collections import deque


class RateLimiter:
    def __init__(self, limit: int, window_s: float, max_keys: int = 10_000) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._hits: dict[str, deque[float]] = {}

    def allow(self, key: str) -> bool:
        """Record one hit for `key`; False if it is over the limit in the window."""
        now = time.monotonic()
        hits = self._hits.get(key)
        if hits is None:
            if len(self._hits) >= self.max_keys:
                self._prune(now)
            hits = self._hits[key] = deque()
        while hits and now - hits[0] > self.window_s:
            hits.popleft()
        if len(hits) >= self.limit:
            return False
        hits.append(now)
        return True

    def exceeded(self, key: str) -> bool:
        """Over the limit, without recording a hit."""
        hits = self._hits.get(key)
        if not hits:
            return False
        now = time.monotonic()
        while hits and now - hits[0] > self.window_s:
            hits.popleft()
        return len(hits) >= self.limit

    def _prune(self, now: float) -> None:
        for key in [k for k, h in self._hits.items() if not h or now - h[-1] > self.window_s]:
            del self._hits[key]
