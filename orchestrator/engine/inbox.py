"""The engine's inbox: inputs in arrival order, and the loop's wait for the next one."""

from __future__ import annotations

import asyncio
from collections import deque

from orchestrator.engine.records import Input


class Inbox:
    """The engine's inputs in arrival order, and the loop's wait for the next one. One future per
    wait, and a timer only when one is due: an `asyncio.Queue` read under `asyncio.timeout` cost
    a timeout context, a timer handle and a getter future on every step."""

    def __init__(self) -> None:
        self._items: deque[Input] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Input) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> Input:
        return self._items.popleft()

    def take(self, limit: int) -> list[Input]:
        """Up to `limit` inputs, oldest first."""
        items = self._items
        if len(items) <= limit:
            taken = list(items)
            items.clear()
            return taken
        return [items.popleft() for _ in range(limit)]

    async def wait(self, delay: float | None) -> None:
        """Until an input arrives, or `delay` seconds pass (None: no limit)."""
        if self._items:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(delay, _wake, waiter) if delay is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
