"""A follower's request to the engine leader that no one answered (it went to a leader that died,
or to nobody) is asked again as soon as another replica announces it leads, not at the end of its
try: in-process, against a real Postgres and Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from orchestrator.bus import keys
from orchestrator.cluster import replicas
from orchestrator.cluster.replicas import LEASE, redis_client
from orchestrator.config import Settings
from orchestrator.engine.records import DeviceChanged
from orchestrator.store.migrate import upgrade
from orchestrator.store.repo import Store
from tests.cluster.inprocess import replica


async def test_a_request_is_asked_again_at_once_when_a_new_leader_announces_itself(
    tmp_path: Path, postgres_db: str, redis_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One try would last an hour: only the announcement can make the follower ask again.
    monkeypatch.setattr(replicas, "RPC_ATTEMPT_S", 3600.0)
    await asyncio.to_thread(upgrade, postgres_db)
    holder = Store(postgres_db)
    assert await holder.acquire_lease(LEASE, "elsewhere", 3600) is not None  # a leader that never answers
    store = Store(postgres_db)
    redis = redis_client(redis_db)
    settings = Settings(data_dir=tmp_path, database_url=postgres_db, redis_url=redis_db, replica_id="follower")
    engine, gateway, follower = replica(settings, store, redis)
    listener = redis_client(redis_db)
    try:
        async with listener.pubsub() as inbox:
            await inbox.subscribe(keys.INBOX)
            await inbox.get_message(timeout=5)  # the subscription's confirmation
            await gateway.start()
            await follower.start()
            assert not follower.is_leader

            async def next_request() -> dict[str, object]:
                async with asyncio.timeout(10):
                    while True:
                        message = await inbox.get_message(ignore_subscribe_messages=True, timeout=1)
                        if message is not None:
                            request: dict[str, object] = orjson.loads(message["data"])
                            if request.get("op") == "submit":
                                return request

            answer = follower.submit(DeviceChanged("dev_x"))
            first = await next_request()
            await listener.publish(keys.LEADER, orjson.dumps({"replica": "newcomer", "fence": 2}))
            again = await next_request()
            assert again["input"] == first["input"] and again["id"] != first["id"]
            await listener.publish(str(again["reply_to"]), orjson.dumps({"id": again["id"], "ok": True, "value": 1}))
            async with asyncio.timeout(10):
                assert await answer == 1
    finally:
        await follower.stop()
        await gateway.stop()
        await engine.stop()
        await listener.aclose()
        await redis.aclose()
        await store.close()
        await holder.close()
