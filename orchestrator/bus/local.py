"""Wake-ups for event readers (SSE) when a task's events are committed.

The events themselves are in the store; what travels here is only "task T has new events", so
a lost or late wake-up delays a reader and never skips an event: readers always read the store
after the last id they sent, and poll it when no wake-up comes (SPEC section 7: the store is the
only truth). In-process by default; `RedisBus` carries the wake-ups across replicas.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any


class Waker:
    """One reader's wake-up flag: set by publishers, cleared by the reader when it looks."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        """True if woken within `timeout` seconds (and reset for the next wait)."""
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            return False
        self._event.clear()
        return True


class LocalBus:
    def __init__(self) -> None:
        self._subs: dict[str, set[Waker]] = defaultdict(set)

    def publish(self, events: list[dict[str, Any]]) -> None:
        """Committed events: wake every reader of their tasks. Never blocks, never raises."""
        self.wake({ev["task_id"] for ev in events})

    def wake(self, task_ids: Iterable[str]) -> None:
        for task_id in task_ids:
            for waker in self._subs.get(task_id, ()):
                waker.wake()

    @asynccontextmanager
    async def subscribe(self, task_id: str) -> AsyncIterator[Waker]:
        waker = Waker()
        self._subs[task_id].add(waker)
        try:
            yield waker
        finally:
            self._subs[task_id].discard(waker)
            if not self._subs[task_id]:
                del self._subs[task_id]

    async def close(self) -> None:
        self._subs.clear()
