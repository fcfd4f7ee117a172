"""How live view events cross replicas (SPEC section 7).

In one process there is nothing to cross: `LocalRelay` does nothing. With replicas, the device's
socket is on one replica and its viewers (or an operator's input waiting for its answer) may be on
another: `RedisRelay` publishes the device's view events on a pub/sub channel of that device
(`keys.view`), and a replica subscribes to it only while one of its viewers or inputs waits on
the device. The device's replica publishes only what none of its own viewers asked for (a frame
of a stream another replica opened, an input result another replica waits on), so a channel
carries frames only while someone, somewhere, watches. Like every Redis message here these are
best effort: a lost frame is replaced by the next one, a lost input answer is reported as
`device_no_answer` (the input may or may not have been applied).

The features each agent announced in its hello are kept in Redis as well (`keys.features`), so
the replica a view is asked of knows whether the device can stream, wherever its socket is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis

from orchestrator.bus import keys

log = logging.getLogger("orrery.views")

Deliver = Callable[[str, dict[str, Any]], bool]  # (device id, event): True if it was for someone here
REDIS_OP_S = 5.0
SUBSCRIBE_WAIT_S = 2.0  # how long a new listener waits for its subscription before going on
MAX_OUTGOING = 256  # events waiting to be published; past this the oldest go (a frame is replaced by the next)


class Relay(Protocol):
    def publish(self, device_id: str, event: dict[str, Any]) -> None:
        """Send an event of the device to the other replicas (never blocks, never raises)."""
        ...

    def listening(self, device_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Hear the device's events published elsewhere while inside."""
        ...

    def announce_features(self, device_id: str, features: frozenset[str]) -> None: ...

    async def features(self, device_id: str) -> frozenset[str] | None:
        """The device's announced features as other replicas heard them, None if unknown."""
        ...

    async def close(self) -> None: ...


class LocalRelay:
    """One process: every socket and every viewer is here."""

    def publish(self, device_id: str, event: dict[str, Any]) -> None:
        pass

    @contextlib.asynccontextmanager
    async def listening(self, device_id: str) -> AsyncIterator[None]:
        yield

    def announce_features(self, device_id: str, features: frozenset[str]) -> None:
        pass

    async def features(self, device_id: str) -> frozenset[str] | None:
        return None

    async def close(self) -> None:
        pass


@dataclass
class _Subscription:
    task: asyncio.Task[None] | None = None
    count: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class RedisRelay:
    """View events through one Redis channel per device, subscribed while someone here waits."""

    def __init__(self, redis: Redis, deliver: Deliver) -> None:
        self.redis = redis
        self.deliver = deliver
        self.origin = secrets.token_hex(6)  # our own publications come back to us: skip them
        self._subs: dict[str, _Subscription] = {}
        self._outgoing: deque[tuple[str, str, bytes]] = deque(maxlen=MAX_OUTGOING)
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._failing = False

    def publish(self, device_id: str, event: dict[str, Any]) -> None:
        self._queue("publish", keys.view(device_id), orjson.dumps({"origin": self.origin, "event": event}))

    def announce_features(self, device_id: str, features: frozenset[str]) -> None:
        self._queue("set", keys.features(device_id), ",".join(sorted(features)).encode())

    async def features(self, device_id: str) -> frozenset[str] | None:
        try:
            async with asyncio.timeout(REDIS_OP_S):
                value = await self.redis.get(keys.features(device_id))
        except Exception as exc:  # Redis away: unknown, and the API says so
            log.warning("could not read device %s's features from Redis: %s", device_id, exc)
            return None
        if value is None:
            return None
        text = value.decode() if isinstance(value, bytes) else str(value)
        return frozenset(f for f in text.split(",") if f)

    @contextlib.asynccontextmanager
    async def listening(self, device_id: str) -> AsyncIterator[None]:
        sub = self._subs.get(device_id)
        if sub is None:
            sub = self._subs[device_id] = _Subscription()
            sub.task = asyncio.create_task(self._listen(device_id, sub), name=f"orrery-view-{device_id}")
        sub.count += 1
        try:
            # Subscribed before anything is asked of the device, so its answer is not missed; a
            # Redis that does not answer in time costs this viewer its remote frames, not its request.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SUBSCRIBE_WAIT_S):
                    await sub.ready.wait()
            yield
        finally:
            sub.count -= 1
            if sub.count == 0 and self._subs.get(device_id) is sub:
                del self._subs[device_id]
                if sub.task is not None:
                    sub.task.cancel()

    async def close(self) -> None:
        tasks = [s.task for s in self._subs.values() if s.task is not None]
        if self._writer is not None:
            tasks.append(self._writer)
        self._subs.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _queue(self, kind: str, target: str, body: bytes) -> None:
        self._outgoing.append((kind, target, body))
        self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="orrery-view-publisher")

    async def _write(self) -> None:
        """One task publishes everything, in order, each batch in one pipeline."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = list(self._outgoing)
            self._outgoing.clear()
            try:
                async with asyncio.timeout(REDIS_OP_S):
                    pipe = self.redis.pipeline(transaction=False)
                    for kind, target, body in batch:
                        if kind == "publish":
                            pipe.publish(target, body)
                        else:
                            pipe.set(target, body)
                    await pipe.execute()
                self._failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # lost: frames are replaced by the next, features re-sent at the next hello
                if not self._failing:
                    log.warning("could not publish live view events to Redis: %s", exc)
                self._failing = True

    async def _listen(self, device_id: str, sub: _Subscription) -> None:
        channel = keys.view(device_id)
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(channel)
                    sub.ready.set()
                    async for raw in pubsub.listen():
                        if raw.get("type") == "message":
                            self._heard(device_id, raw["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away: subscribe again; frames meanwhile are lost
                log.warning("live view subscription of device %s lost (%s); resubscribing", device_id, exc)
                await asyncio.sleep(0.5)

    def _heard(self, device_id: str, data: Any) -> None:
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if isinstance(body, dict) and body.get("origin") != self.origin and isinstance(body.get("event"), dict):
            self.deliver(device_id, body["event"])
