"""The throwaway Postgres and Redis fixtures (tests/services.py) give working, isolated servers."""

from __future__ import annotations

import os

import asyncpg
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests import services


async def test_postgres_db_answers_select_1_through_asyncpg(postgres_db: str) -> None:
    conn = await asyncpg.connect(services.asyncpg_dsn(postgres_db))
    try:
        assert await conn.fetchval("SELECT 1") == 1
        assert await conn.fetchval("SELECT current_database()") == postgres_db.rsplit("/", 1)[1]
    finally:
        await conn.close()


async def test_postgres_db_url_is_the_form_the_orchestrator_takes(postgres_db: str) -> None:
    assert postgres_db.startswith("postgresql+asyncpg://")
    engine = create_async_engine(postgres_db)
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    finally:
        await engine.dispose()


async def test_postgres_db_starts_empty(postgres_db: str) -> None:
    conn = await asyncpg.connect(services.asyncpg_dsn(postgres_db))
    try:
        tables = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        assert tables == 0
        await conn.execute("CREATE TABLE leftover (id int)")  # must not be seen by any other test
    finally:
        await conn.close()


def test_fresh_databases_are_distinct_and_dropped_afterwards(postgres_url: str) -> None:
    async def exists(name: str) -> bool:
        conn = await asyncpg.connect(services.asyncpg_dsn(postgres_url))
        try:
            return bool(await conn.fetchval("SELECT count(*) FROM pg_database WHERE datname = $1", name))
        finally:
            await conn.close()

    with services.fresh_database(postgres_url) as a, services.fresh_database(postgres_url) as b:
        names = [a.rsplit("/", 1)[1], b.rsplit("/", 1)[1]]
        assert names[0] != names[1]
        assert all(services.run_async(exists(n)) for n in names)
    assert not any(services.run_async(exists(n)) for n in names)


def test_throwaway_postgres_does_not_run_as_root(postgres_url: str) -> None:
    if os.environ.get(services.POSTGRES_ENV):
        pytest.skip("the Postgres server is the one named by ORRERY_TEST_POSTGRES_URL")

    async def data_directory() -> str:
        conn = await asyncpg.connect(services.asyncpg_dsn(postgres_url))
        try:
            return str(await conn.fetchval("SHOW data_directory"))
        finally:
            await conn.close()

    path = services.run_async(data_directory())
    assert os.stat(path).st_uid != 0 or os.geteuid() != 0


def test_redis_db_answers_ping_and_starts_empty(redis_db: str) -> None:
    client = redis.Redis.from_url(redis_db)
    try:
        assert client.ping() is True
        assert client.dbsize() == 0
        client.set("leftover", "1")  # must not be seen by any other test
    finally:
        client.close()


def test_each_test_gets_an_empty_redis_database(redis_url: str) -> None:
    databases = services.RedisDatabases.for_server(redis_url)
    first = databases.next_url()
    client = redis.Redis.from_url(first)
    try:
        client.set("k", "v")
    finally:
        client.close()
    second = databases.next_url()
    client = redis.Redis.from_url(second)
    try:
        assert client.dbsize() == 0
    finally:
        client.close()


def test_a_configured_redis_is_used_instead_of_starting_one(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(services.REDIS_ENV, redis_url)
    with services.redis_server() as url:
        assert url == redis_url


def test_a_configured_postgres_must_be_an_asyncpg_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(services.POSTGRES_ENV, "postgresql://u@127.0.0.1/db")
    with pytest.raises(services.ServiceError, match="postgresql\\+asyncpg"), services.postgres_server():
        pass


def test_missing_binaries_skip_on_a_developer_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="redis-server not found"):
        services.unavailable("redis-server not found")


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_missing_binaries_fail_under_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        services.unavailable("redis-server not found")


def test_missing_redis_binary_skips_without_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(services.REDIS_ENV, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.skip.Exception, match="redis-server not found"), services.redis_server():
        pass


def test_redis_url_database_number_is_replaced() -> None:
    assert services.with_redis_db("redis://:pw@h:6379/0", 7) == "redis://:pw@h:6379/7"
    assert services.with_redis_db("redis://h:6379", 3) == "redis://h:6379/3"
