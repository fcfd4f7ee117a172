"""The device catalogue version (migration 0013) and a follower's copy of the fleet kept by it.

The version moves with every committed change submission checks read of the devices, and not
with the engine's bookkeeping at every dispatch; a follower validates against its copy and reads
the rows again exactly when the version moved. On Postgres the count is taken at commit: never
seen before the change is, and two transactions changing devices never deadlock through it."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from orchestrator.cluster.replicas import redis_client
from orchestrator.config import Settings
from orchestrator.engine import controls, restore
from orchestrator.store.migrate import downgrade, upgrade
from orchestrator.store.models import Device
from orchestrator.store.repo import ChangeSet, Store
from tests.cluster.inprocess import replica

AT = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
CATALOG = importlib.import_module("migrations.versions.0013_device_catalog_version")
# What the engine writes at every dispatch or connection (a follower's copy may lag on it), and
# what never changes or no check reads.
BOOKKEEPING = {"id", "fence", "current_batch_id", "session_epoch", "token_hash"}


def test_every_column_a_follower_reads_of_a_device_is_watched_but_the_engines_bookkeeping() -> None:
    """A column `device_from_row` starts to read must move the version too (or be bookkeeping)."""
    source = inspect.getsource(restore.device_from_row) + inspect.getsource(controls.controls_of)
    read = set(re.findall(r"\brow\.(\w+)", source))
    assert read - BOOKKEEPING == set(CATALOG.WATCHED), "migration 0013's WATCHED and device_from_row disagree"


def device(device_id: str, name: str) -> dict[str, object]:
    return {"id": device_id, "name": name, "token_hash": f"h-{device_id}", "created_at": AT, "labels": {"k": "a"}}


async def engine_write(store: Store, device_id: str, **values: object) -> None:
    """As the engine writes: one change set, through the store's writer."""
    changes = ChangeSet()
    changes.update(Device, (device_id,), **values)
    await store.write(changes)


async def test_on_postgres_the_version_moves_with_what_checks_read_only(postgres_db: str) -> None:
    await asyncio.to_thread(upgrade, postgres_db)
    store = Store(postgres_db)
    try:
        start = await store.device_catalog_version()
        assert start is not None
        await store.add(Device, device("dev_c1", "one"))
        await store.add(Device, device("dev_c2", "two"))
        made = await store.device_catalog_version()
        assert made > start  # rows made count

        # The engine's bookkeeping at every dispatch and connection does not.
        await engine_write(store, "dev_c1", fence=7, current_batch_id="b_1", last_seen=AT, session_epoch=3)
        await engine_write(store, "dev_c1", labels={"k": "a"})  # written again, unchanged
        assert await store.device_catalog_version() == made

        # Each change a check reads does, whichever way it is written.
        seen = made
        for values in (
            {"labels": {"k": "b"}},
            {"reported_labels": {"gpu": "yes"}},
            {"platform": "linux"},
            {"tools": [{"name": "shell.run"}]},
            {"liveness": "online"},
            {"admin_state": "cordoned", "cordon_reason": "maintenance"},
            {"control": {"gen": 1, "stop_reason": "an operator"}},
            {"name": "uno"},
        ):
            await engine_write(store, "dev_c1", **values)
            now = await store.device_catalog_version()
            assert now > seen, f"{values} did not move the version"
            seen = now
        await store.update(Device, ("dev_c2",), labels={"k": "z"})
        assert await store.device_catalog_version() > seen
    finally:
        await store.close()


async def test_on_sqlite_no_version_is_kept_and_a_follower_reads_every_row(tmp_path: Path, redis_db: str) -> None:
    """One process checks against its engine's memory; the engine's writes pay for no trigger."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'o.db'}"
    await asyncio.to_thread(upgrade, url)
    store = Store(url)
    redis = redis_client(redis_db)
    _, _, follower = replica(Settings(data_dir=tmp_path, database_url=url, redis_url=redis_db), store, redis)
    try:
        await store.add(Device, device("dev_s1", "s1"))
        assert await store.device_catalog_version() is None
        first = await follower.devices()
        await engine_write(store, "dev_s1", labels={"k": "b"})
        assert [d.labels for d in await follower.devices()] == [{"k": "b"}]
        assert (await follower.devices())[0] is not first[0]
    finally:
        await redis.aclose()
        await store.close()


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def test_on_postgres_a_change_counts_at_its_commit_and_two_writers_never_wait_on_the_count(
    postgres_db: str,
) -> None:
    """Two transactions: A changes device 1, B device 2, then A waits for device 2 (B holds it)
    until B commits. Were the count taken at each change, B's change would wait for A's count
    and A for B's row (a deadlock, one aborted). Taken at commit, B's change goes through at once
    and both commit; and neither change is counted before its commit."""
    await asyncio.to_thread(upgrade, postgres_db)
    store = Store(postgres_db)
    a = await asyncpg.connect(_dsn(postgres_db))
    b = await asyncpg.connect(_dsn(postgres_db))
    try:
        await store.add(Device, device("dev_d1", "d1"))
        await store.add(Device, device("dev_d2", "d2"))
        before = await store.device_catalog_version()
        ta, tb = a.transaction(), b.transaction()
        await ta.start()
        await tb.start()
        await a.execute("""UPDATE devices SET labels = '{"k": "a1"}' WHERE id = 'dev_d1'""")
        # A row lock-free update: at once (10 s is only the bound on a broken count's wait).
        await asyncio.wait_for(b.execute("""UPDATE devices SET labels = '{"k": "b2"}' WHERE id = 'dev_d2'"""), 10)
        assert await store.device_catalog_version() == before  # nothing committed yet
        blocked = asyncio.ensure_future(a.execute("UPDATE devices SET fence = fence + 1 WHERE id = 'dev_d2'"))
        async with asyncio.timeout(20):
            while not await b.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ):
                await asyncio.sleep(0.02)  # until A waits for B's row
            await tb.commit()
            assert await store.device_catalog_version() == before + 1  # B's change, at its commit
            await blocked
            await ta.commit()
        assert await store.device_catalog_version() == before + 2
    finally:
        await a.close()
        await b.close()
        await store.close()


async def test_a_follower_validates_against_its_copy_and_reads_it_again_when_the_version_moved(
    postgres_db: str, redis_db: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(upgrade, postgres_db)
    store = Store(postgres_db)
    redis = redis_client(redis_db)
    settings = Settings(data_dir=tmp_path, database_url=postgres_db, redis_url=redis_db)
    _, _, follower = replica(settings, store, redis)  # never started: it follows
    try:
        assert await follower.devices() == []
        await store.add(Device, device("dev_f1", "f1"))
        first = await follower.devices()
        assert [(d.id, d.labels) for d in first] == [("dev_f1", {"k": "a"})]

        await engine_write(store, "dev_f1", fence=3, current_batch_id="b_9")
        again = await follower.devices()
        assert again[0] is first[0]  # the copy, not the rows read again
        fresh = await follower.devices(fresh=True)
        assert fresh[0] is not first[0] and fresh[0].current_batch == "b_9"  # a dry run's busy flags are now's

        await engine_write(store, "dev_f1", labels={"k": "b"})
        changed = await follower.devices()
        assert [(d.id, d.labels) for d in changed] == [("dev_f1", {"k": "b"})]
        await store.add(Device, device("dev_f2", "f2"))
        assert sorted(d.id for d in await follower.devices()) == ["dev_f1", "dev_f2"]

        # A schema from before the version (this replica started before the migration ran):
        # every row is read, as before it.
        await asyncio.to_thread(downgrade, postgres_db, "0012")
        assert await store.device_catalog_version() is None
        await store.update(Device, ("dev_f2",), labels={"k": "c"})
        assert {d.id: d.labels for d in await follower.devices()}["dev_f2"] == {"k": "c"}
    finally:
        await redis.aclose()
        await store.close()
