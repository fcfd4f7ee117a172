"""The engine lease against a real Postgres and Redis: a replica that lost it stops for good, and
cannot start a second engine loop on its old engine while it shuts down (in-process); a killed
leader is succeeded as soon as its Postgres session ends, long before its lease expires."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from pathlib import Path

from sqlalchemy import text

from orchestrator.cluster.replicas import LEASE
from orchestrator.config import Settings
from orchestrator.store.migrate import upgrade
from orchestrator.store.repo import Store
from tests.cluster.inprocess import replica
from tests.cluster.replicaset import ReplicaSet
from tests.support import shell, wait_until

TTL_S = 30.0  # long: only a takeover before the expiry passes the bounds below


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


def test_a_killed_leader_is_succeeded_long_before_its_lease_expires_and_its_task_finishes(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    """`kill -9` of the leader: the kernel closes its sockets, Postgres ends its session, and a
    follower (trying every 0.5 s) takes the lease at once, with the next fence; the task running
    on a device of the follower finishes there. Every wait is bounded well below the 30 s TTL,
    which a takeover at the expiry could not meet."""
    with ReplicaSet(tmp_path, postgres_db, redis_db, lease_ttl_s=f"{TTL_S:g}") as rs:
        leader = rs.leader()
        other = next(r for r in rs.replicas if r is not leader)
        fence = leader.status()["cluster"]["fence"]
        agent = rs.agent_on(other, "survivor")
        steps = [f"s{i}" for i in range(4)]
        dag = {
            "nodes": [{"id": s, "commands": [shell(["sh", "-c", f"echo {s} >> ran.txt; sleep 0.5"])]} for s in steps],
            "edges": [{"from": x, "to": y} for x, y in itertools.pairwise(steps)],
        }
        with other.client() as c:
            task = c.post("/v1/tasks", json={"dag": dag}).json()
        ran = agent.workspace / "ran.txt"
        wait_until(lambda: ran.exists() and len(ran.read_text().split()) >= 1, 60, "the first step to run")
        killed = time.monotonic()
        leader.kill(signal.SIGKILL)
        rs.server = other
        wait_until(other.is_leader, 8, "the follower to lead, long before the lease expires")
        done = rs.wait_task(task["id"], timeout=TTL_S - 10 - (time.monotonic() - killed))
        finished = time.monotonic() - killed
        assert done["state"] == "succeeded", done
        assert finished < TTL_S - 5, f"the task ended {finished:.1f}s after the kill"
        assert other.status()["cluster"]["fence"] == fence + 1
        assert ran.read_text().split() == steps  # each step ran exactly once
        assert all(len(n["attempts"]) == 1 for n in done["nodes"])
