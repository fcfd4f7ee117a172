"""In-process event bus: every subscriber of a task gets every event published for it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

ALL = "*"


class LocalBus:
    """Fan-out by task id (and `*` for every task). A slow subscriber loses nothing: its queue is
    unbounded, and SSE readers that fall far behind re-read from the store anyway."""

    def __init__(self) -> None:
        self._subs: dict[str, set[asyncio.Queue[dict[str, Any]]]] = defaultdict(set)

    async def publish(self, events: list[dict[str, Any]]) -> None:
        for ev in events:
            for key in (ev["task_id"], ALL):
                for q in self._subs.get(key, ()):
                    q.put_nowait(ev)

    @asynccontextmanager
    async def subscribe(self, task_id: str) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._subs[task_id].add(q)
        try:
            yield q
        finally:
            self._subs[task_id].discard(q)
            if not self._subs[task_id]:
                del self._subs[task_id]

    async def close(self) -> None:
        self._subs.clear()
