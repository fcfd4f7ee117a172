"""The store's half of one writer (SPEC section 7, fencing): a commit guarded by the engine lease
writes only while its writer still holds that lease, under the fence it was given. Replicas run
on Postgres only, so this runs there (a throwaway server from the local binaries)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

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


# ---------------------------------------------------------------- a dead holder's lease


@pytest.fixture
async def stores(postgres_db: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two replicas' stores on one database: each holds its own lease session."""
    await asyncio.to_thread(upgrade, postgres_db)
    a, b = Store(postgres_db), Store(postgres_db)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def _sql(store: Store, sql: str) -> object:
    """One statement on a pooled connection (not the store's lease session): a third party."""
    async with store.engine.begin() as conn:
        return (await conn.execute(text(sql))).scalar()


async def _holder_pid(store: Store) -> int | None:
    found = await _sql(store, f"SELECT holder_pid FROM leases WHERE name = '{LEASE}'")
    return int(found) if isinstance(found, int) else None


async def _take(store: Store, ttl_s: float = 30) -> tuple[int, int]:
    """Replica A takes the lease on `store`: (its fence, the pid of the session it recorded)."""
    fence = await store.acquire_lease(LEASE, "replica-a", ttl_s)
    assert fence is not None
    pid = await _holder_pid(store)
    assert pid is not None
    return fence, pid


async def _terminate(store: Store, pid: int) -> None:
    """End backend `pid` from `store`'s pool (its process killed, say), and wait until it is gone."""
    assert await _sql(store, f"SELECT pg_terminate_backend({pid}, 5000)")
    await _session_ends(store, pid)


async def _session_ends(store: Store, pid: int) -> None:
    """Wait (bounded, well below any lease's TTL) until backend `pid` is gone from Postgres."""
    async with asyncio.timeout(5):
        while await _sql(store, f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"):
            await asyncio.sleep(0.02)


async def test_a_lease_whose_holder_session_is_gone_is_taken_at_once_and_its_old_holder_writes_nothing(
    stores: tuple[Store, Store],
) -> None:
    a, b = stores
    fence, pid = await _take(a)
    await a.write(new_task("t1", (LEASE, "replica-a", fence)))
    assert await b.acquire_lease(LEASE, "replica-b", 30) is None  # A's session lives: refused
    assert await b.acquire_lease(LEASE, "replica-b", 30) is None
    # A's lease session ends (its process killed, say) while A's writer lives on.
    await _terminate(b, pid)
    started = asyncio.get_running_loop().time()
    taken = await b.acquire_lease(LEASE, "replica-b", 30)  # long before the 30 s expiry
    assert taken == fence + 1
    assert asyncio.get_running_loop().time() - started < 5
    assert await b.lease_holder(LEASE) == "replica-b" and await _holder_pid(b) not in (None, pid)
    with pytest.raises(LeaseLost):  # a commit A's engine still makes under its old term
        await a.write(new_task("t2", (LEASE, "replica-a", fence)))
    assert await a.get_task("t2") is None
    # A's lease connection is made again; its renewal finds the lease lost, B's session alive.
    assert await a.acquire_lease(LEASE, "replica-a", 30) is None
    await b.write(new_task("t3", (LEASE, "replica-b", taken)))
    assert await b.get_task("t3") is not None


async def test_a_lease_whose_holder_session_ended_with_a_postgres_restart_waits_for_its_expiry(
    stores: tuple[Store, Store],
) -> None:
    """A Postgres restart ends every session, a living leader's too: a lease last renewed before
    the server (re)started says nothing of its holder, who reconnects and renews; taken only
    once it has expired."""
    a, b = stores
    fence, pid = await _take(a, 2)
    # As after a restart: A's last renewal came before the server started, and its session is gone.
    # (The trigger that keeps holder_pid to its own session is set aside for this one write.)
    async with b.engine.begin() as conn:
        await conn.execute(text("ALTER TABLE leases DISABLE TRIGGER leases_holder_pid"))
        await conn.execute(text("UPDATE leases SET renewed_at = pg_postmaster_start_time() - interval '1 second'"))
        await conn.execute(text("ALTER TABLE leases ENABLE TRIGGER leases_holder_pid"))
    await _terminate(b, pid)
    assert await b.acquire_lease(LEASE, "replica-b", 30) is None  # not expired: refused
    async with asyncio.timeout(10):  # its 2 s expiry passes: taken then
        while (taken := await b.acquire_lease(LEASE, "replica-b", 30)) is None:
            await asyncio.sleep(0.1)
    assert taken == fence + 1


async def test_a_lease_whose_holder_closed_its_store_without_releasing_is_taken_at_once(
    stores: tuple[Store, Store], postgres_db: str
) -> None:
    a, b = stores
    fence, pid = await _take(a)
    assert await b.acquire_lease(LEASE, "replica-b", 30) is None
    await a.close()  # its connections closed, the lease not released (it expires in 30 s)
    await _session_ends(b, pid)
    assert await b.acquire_lease(LEASE, "replica-b", 30) == fence + 1
    again = Store(postgres_db)  # A restarted: a guarded write of its old term is refused
    try:
        with pytest.raises(LeaseLost):
            await again.write(new_task("t1", (LEASE, "replica-a", fence)))
        assert await again.get_task("t1") is None
    finally:
        await again.close()


async def test_a_lease_renewed_without_a_session_is_taken_only_once_it_has_expired(
    stores: tuple[Store, Store],
) -> None:
    """A replica from before `holder_pid` renews the lease without it: the session the column
    named is not the one writing, so the column is cleared, and the lease waits for its expiry."""
    a, b = stores
    fence, pid = await _take(a)
    # An older replica (as its code wrote it: no holder_pid) takes the lease from A.
    await _sql(
        b,
        "UPDATE leases SET holder = 'replica-old', fence = fence + 1, expires_at = now() + interval '30 seconds'"
        f" WHERE name = '{LEASE}' RETURNING fence",
    )
    assert await _holder_pid(a) is None  # A's pid is not left behind for the older replica's lease
    await a.close()
    await _session_ends(b, pid)
    assert await b.acquire_lease(LEASE, "replica-b", 30) is None  # no session known dead: wait
    await _sql(b, f"UPDATE leases SET holder_pid = NULL WHERE name = '{LEASE}' RETURNING 1")
    assert await b.acquire_lease(LEASE, "replica-b", 30) is None
    await _sql(b, f"UPDATE leases SET expires_at = now() - interval '1 second' WHERE name = '{LEASE}' RETURNING 1")
    assert await b.acquire_lease(LEASE, "replica-b", 30) == fence + 2


async def test_a_holder_whose_lease_connection_was_lost_renews_on_a_new_one_and_keeps_its_term(
    stores: tuple[Store, Store],
) -> None:
    a, b = stores
    fence, pid = await _take(a)
    await _terminate(b, pid)
    assert await a.acquire_lease(LEASE, "replica-a", 30) == fence  # renewed first: the same term
    renewed = await _holder_pid(a)
    assert renewed not in (None, pid)  # its new session recorded
    assert await b.acquire_lease(LEASE, "replica-b", 30) is None
    await a.write(new_task("t1", (LEASE, "replica-a", fence)))
    assert await a.get_task("t1") is not None
