"""The store's half of one writer (SPEC section 7, fencing): a commit guarded by the engine lease
writes only while its writer still holds that lease, under the fence it was given. Replicas run
on Postgres only, so this runs there (a throwaway server from the local binaries)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from orchestrator.store.migrate import upgrade
from orchestrator.store.models import Task
from orchestrator.store.repo import ChangeSet, LeaseLost, Store

LEASE = "engine"
AT = datetime(2026, 11, 29, 12, 30, tzinfo=UTC)


@pytest.fixture
async def store(postgres_db: str) -> AsyncIterator[Store]:
    await asyncio.to_thread(upgrade, postgres_db)
    store = Store(postgres_db)
    try:
        yield store
    finally:
        await store.close()


def new_task(task_id: str, guard: tuple[str, str, int]) -> ChangeSet:
    changes = ChangeSet(guard=guard)
    changes.insert(Task, {"id": task_id, "name": task_id, "state": "running", "priority": 0, "created_at": AT})
    return changes


async def test_a_writer_whose_lease_went_to_another_and_came_back_cannot_write_under_its_old_fence(
    store: Store,
) -> None:
    first = await store.acquire_lease(LEASE, "replica-a", 30)
    assert first is not None
    await store.write(new_task("t1", (LEASE, "replica-a", first)))  # it holds the lease: written
    await store.release_lease(LEASE, "replica-a")  # it lost it (paused past its expiry, say)...
    assert await store.acquire_lease(LEASE, "replica-b", 30) == first + 1
    await store.release_lease(LEASE, "replica-b")
    again = await store.acquire_lease(LEASE, "replica-a", 30)  # ...and the same replica won it back
    assert again == first + 2
    with pytest.raises(LeaseLost):  # a commit its former term still had in flight
        await store.write(new_task("t2", (LEASE, "replica-a", first)))
    assert await store.get_task("t2") is None
    await store.write(new_task("t3", (LEASE, "replica-a", again)))  # its current term writes
    assert await store.get_task("t3") is not None


async def test_a_writer_whose_lease_expired_or_was_taken_over_writes_nothing(store: Store) -> None:
    fence = await store.acquire_lease(LEASE, "replica-a", 30)
    assert fence is not None
    await store.release_lease(LEASE, "replica-a")  # expired, and nobody holds it yet
    with pytest.raises(LeaseLost):
        await store.write(new_task("t1", (LEASE, "replica-a", fence)))
    taken = await store.acquire_lease(LEASE, "replica-b", 30)
    assert taken == fence + 1
    with pytest.raises(LeaseLost):  # taken over: the fence it names is not the holder's
        await store.write(new_task("t2", (LEASE, "replica-a", taken)))
    assert await store.get_task("t1") is None and await store.get_task("t2") is None
