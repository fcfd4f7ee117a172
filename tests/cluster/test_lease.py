"""The engine lease, in-process against a real Postgres and Redis: a replica that lost it stops
for good, and cannot start a second engine loop on its old engine while it shuts down."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import text

from orchestrator.cluster.replicas import LEASE
from orchestrator.config import Settings
from orchestrator.store.migrate import upgrade
from orchestrator.store.repo import Store
from tests.cluster.inprocess import replica


async def test_a_replica_that_lost_the_lease_never_leads_again_even_when_it_is_free(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    from redis.asyncio import Redis

    await asyncio.to_thread(upgrade, postgres_db)
    settings = Settings(data_dir=tmp_path, database_url=postgres_db, redis_url=redis_db, lease_ttl_s=0.6)
    store = Store(postgres_db)
    redis = Redis.from_url(redis_db)
    engine, gateway, cluster = replica(settings, store, redis)
    stopped = asyncio.Event()
    fatal: list[BaseException] = []
    engine.on_fatal = lambda exc: (fatal.append(exc), stopped.set())
    await gateway.start()
    await cluster.start()
    try:
        assert cluster.is_leader
        loop_task = engine._task
        elect = next(t for t in cluster._tasks if t.get_name() == "cluster-elect")
        async with store.engine.begin() as conn:  # another replica takes the lease
            await conn.execute(
                text("UPDATE leases SET holder = 'thief', expires_at = now() + interval '1 hour' WHERE name = :n"),
                {"n": LEASE},
            )
        async with asyncio.timeout(10):
            await stopped.wait()
        assert not cluster.is_leader and "lease lost" in str(fatal[0])
        async with store.engine.begin() as conn:  # the lease is free again while we shut down
            await conn.execute(
                text("UPDATE leases SET expires_at = now() - interval '1 second' WHERE name = :n"), {"n": LEASE}
            )
        async with asyncio.timeout(10):
            await asyncio.wait({elect})  # the election loop ends instead of trying again
        assert not cluster.is_leader and engine._task is loop_task and len(fatal) == 1
        assert await store.lease_holder(LEASE) == "thief"
    finally:
        await cluster.stop()
        await gateway.stop()
        await engine.stop()
        await redis.aclose()
        await store.close()
