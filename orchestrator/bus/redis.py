"""Wake-ups across replicas: a replica that commits events wakes its own readers at once and
tells the others through Redis which tasks have news (SPEC section 7). Best effort by design:
publishing happens in the background, and losing a message (Redis restarting, a subscriber
cut off) only means readers on other replicas find the events on their next poll of the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from redis.asyncio import Redis

from orchestrator.bus import keys
from orchestrator.bus.local import LocalBus

log = logging.getLogger("orrery.bus")

REDIS_OP_S = 5.0
MAX_PENDING = 10_000  # task ids waiting to be announced; past this the oldest are dropped (readers poll)


class RedisBus(LocalBus):
    def __init__(self, redis: Redis) -> None:
        super().__init__()
        self.redis = redis
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._pending: dict[str, None] = {}  # task ids to announce, in order, without repeats
        self._has_pending = asyncio.Event()

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read(), name="orrery-events-reader")
        self._writer = asyncio.create_task(self._write(), name="orrery-events-writer")
        with contextlib.suppress(TimeoutError):  # serve anyway: readers poll the store
            async with asyncio.timeout(10):
                await self._subscribed.wait()

    def publish(self, events: list[dict[str, Any]]) -> None:
        task_ids = {ev["task_id"] for ev in events}
        self.wake(task_ids)
        for task_id in task_ids:
            self._pending[task_id] = None
        while len(self._pending) > MAX_PENDING:
            del self._pending[next(iter(self._pending))]
        self._has_pending.set()

    async def _write(self) -> None:
        failing = False
        while True:
            await self._has_pending.wait()
            self._has_pending.clear()
            batch, self._pending = list(self._pending), {}
            try:
                async with asyncio.timeout(REDIS_OP_S):
                    await self.redis.publish(keys.EVENTS, orjson.dumps(batch))
                if failing:
                    log.warning("event wake-ups reach Redis again")
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:
                    log.warning("could not announce events through Redis (%s); other replicas poll", exc)
                failing = True

    async def _read(self) -> None:
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(keys.EVENTS)
                    self._subscribed.set()
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            with contextlib.suppress(ValueError, TypeError):
                                self.wake(str(t) for t in orjson.loads(message["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away: reconnect; readers poll the store meanwhile
                log.warning("event subscription lost (%s); resubscribing", exc)
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        for task in (self._reader, self._writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await super().close()
