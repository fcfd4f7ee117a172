"""A request relayed to the engine leader ends in an answer or in `ClusterUnavailable` (503
`cluster_unavailable`), never in another exception (which the API would answer with a 500):
in-process, against a real Postgres and Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cluster.replicas import ClusterUnavailable, RedisCluster
from orchestrator.config import Settings
from orchestrator.domain.model import DagSpec
from orchestrator.engine.core import Engine
from orchestrator.engine.intake import Submission
from orchestrator.engine.records import SubmitTask
from orchestrator.store.migrate import upgrade
from orchestrator.store.repo import Store
from tests.cluster.inprocess import replica


def submission(task_id: str) -> SubmitTask:
    spec = DagSpec.model_validate({"nodes": [{"id": "n", "commands": [{"tool": "sim.act"}]}]})
    return SubmitTask(Submission(task_id=task_id, name=task_id, body_hash="h", created=time.time(), spec=spec))


class Replicas:
    def __init__(self, tmp: Path, postgres_db: str, redis_db: str) -> None:
        self.tmp, self.postgres_db, self.redis_db = tmp, postgres_db, redis_db
        self.stops: list[Any] = []

    async def start(self, name: str) -> tuple[RedisCluster, Engine]:
        from redis.asyncio import Redis

        settings = Settings(
            data_dir=self.tmp / name,
            database_url=self.postgres_db,
            redis_url=self.redis_db,
            replica_id=name,
            cluster_request_timeout_s=2,
        )
        store = Store(self.postgres_db)
        redis = Redis.from_url(self.redis_db)
        engine, gateway, cluster = replica(settings, store, redis)
        await gateway.start()
        await cluster.start()
        self.stops += [cluster.stop, gateway.stop, engine.stop, redis.aclose, store.close]
        return cluster, engine

    async def close(self) -> None:
        for stop in self.stops:
            await stop()


@pytest.fixture
async def replicas(tmp_path: Path, postgres_db: str, redis_db: str) -> AsyncIterator[Replicas]:
    await asyncio.to_thread(upgrade, postgres_db)
    started = Replicas(tmp_path, postgres_db, redis_db)
    try:
        yield started
    finally:
        await started.close()


async def test_becoming_leader_while_waiting_with_an_engine_too_slow_to_answer_is_unavailable(
    replicas: Replicas,
) -> None:
    """The replica asked as a follower, then won the lease, but its engine (recovering, or busy on
    a loaded machine) did not answer in the time left: 503, not the bare `TimeoutError` (500)."""
    cluster, engine = await replicas.start("a")
    assert cluster.is_leader
    cluster._leader = False  # a follower when the request came in
    answer = cluster.submit(submission("task_1"))
    await asyncio.sleep(0)  # its request is on its way (a yield, not a wait)

    async def stalled(item: Any, now: float) -> Any:
        await asyncio.sleep(30)

    engine._handlers[SubmitTask] = stalled
    cluster._leader = True  # ...and the leader while it waited
    with pytest.raises(ClusterUnavailable, match="no engine leader answered within 2s"):
        async with asyncio.timeout(10):
            await answer


async def test_a_leader_whose_engine_fails_on_the_input_is_unavailable_with_its_reason(
    replicas: Replicas,
) -> None:
    """The leader answered `ok: false` (its engine raised, e.g. it lost the lease mid-commit):
    the follower says 503 with the leader's reason, not a `RuntimeError` (500)."""
    leader, engine = await replicas.start("a")
    follower, _ = await replicas.start("b")
    assert leader.is_leader and not follower.is_leader

    async def failing(item: Any, now: float) -> Any:
        raise RuntimeError("lease lost while committing")

    engine._handlers[SubmitTask] = failing
    answer = follower.submit(submission("task_2"))
    with pytest.raises(ClusterUnavailable, match="lease lost while committing"):
        async with asyncio.timeout(10):
            await answer
