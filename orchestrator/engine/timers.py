"""The engine's timers: typed, ordered by when they fire (ties in the order they were added)."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from orchestrator.engine.records import NodeKey


@dataclass(frozen=True)
class QueueTimeout:
    """A READY or QUEUED node since `since` has waited its queue_timeout_s (ignored if it has
    been placed or made ready again since)."""

    key: NodeKey
    since: float


@dataclass(frozen=True)
class AttemptDeadline:
    batch_id: str


@dataclass(frozen=True)
class AcceptDeadline:
    """The device had batch_accept_timeout_s to accept the batch."""

    batch_id: str


@dataclass(frozen=True)
class ApprovalExpiry:
    """Nobody decided on approval `approval_id` within approval_timeout_s."""

    approval_id: str


@dataclass(frozen=True)
class ProbeTimeout:
    """Node `key`, waiting since `since` for a device to run its verify commands, has
    waited probe_timeout_s (ignored if it is no longer waiting since then)."""

    key: NodeKey
    since: float


@dataclass(frozen=True)
class Sweep:
    """Look for devices nobody has reported for a heartbeat timeout (re-armed when it fires)."""


@dataclass(frozen=True)
class Wake:
    """Only makes the loop run a step (a backoff ended, soft changes are due, a reconcile)."""


Timer = QueueTimeout | AttemptDeadline | AcceptDeadline | ApprovalExpiry | ProbeTimeout | Sweep | Wake


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()

    def add(self, when: float, timer: Timer) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), timer))

    def due(self, now: float) -> list[tuple[float, Timer]]:
        """Remove and return every timer due at `now`, earliest first, as (when, timer)."""
        fired: list[tuple[float, Timer]] = []
        while self._heap and self._heap[0][0] <= now:
            when, _, timer = heapq.heappop(self._heap)
            fired.append((when, timer))
        return fired

    def next_at(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
