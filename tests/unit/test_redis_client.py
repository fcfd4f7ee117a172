"""A replica's Redis client under a burst: more commands at once than it has connections wait for
one, none fails (a fan-out relays hundreds of results at once; a request or an answer lost to
"Too many connections" made its node wait out a whole cross-replica attempt)."""

from __future__ import annotations

import asyncio

from orchestrator.cluster.replicas import REDIS_CONNECTIONS, redis_client


async def test_a_burst_beyond_the_pool_waits_for_connections_and_loses_nothing(redis_db: str) -> None:
    redis = redis_client(redis_db)
    try:
        async with redis.pubsub() as sub:
            await sub.subscribe("burst")
            await sub.get_message(timeout=5)  # the subscription's confirmation
            burst = 3 * REDIS_CONNECTIONS
            sent = await asyncio.gather(*(redis.publish("burst", str(i)) for i in range(burst)))
            assert sent == [1] * burst  # every one published, each heard by our one subscriber
            heard: set[str] = set()
            async with asyncio.timeout(30):
                while len(heard) < burst:
                    message = await sub.get_message(ignore_subscribe_messages=True, timeout=1)
                    if message is not None:
                        heard.add(message["data"].decode())
            assert heard == {str(i) for i in range(burst)}
    finally:
        await redis.aclose()
