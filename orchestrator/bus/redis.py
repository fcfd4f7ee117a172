"""Event fan-out across replicas: committed events go to Redis, and every replica's subscriber
hands them to its local SSE readers (SPEC section 7)."""

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


class RedisBus(LocalBus):
    def __init__(self, redis: Redis) -> None:
        super().__init__()
        self.redis = redis
        self._reader: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read(), name="orrery-events-reader")
        async with asyncio.timeout(10):
            await self._subscribed.wait()

    async def publish(self, events: list[dict[str, Any]]) -> None:
        wire = [{"id": e["id"], "task_id": e["task_id"], "type": e["type"], "data": e["data"]} for e in events]
        await self.redis.publish(keys.EVENTS, orjson.dumps(wire))

    async def _read(self) -> None:
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(keys.EVENTS)
                    self._subscribed.set()
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            await LocalBus.publish(self, orjson.loads(message["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away: reconnect; SSE readers re-read the store
                log.warning("event subscription lost (%s); resubscribing", exc)
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await super().close()
