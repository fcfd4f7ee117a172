"""Shared servers for tests that only need one and do not disturb it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import RedisDatabases, fresh_database, postgres_server, redis_server
from tests.support import Fleet


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One server for a module: short hello timeout, small frames, fast heartbeats."""
    tmp: Path = tmp_path_factory.mktemp("fleet")
    with Fleet(tmp, hello_timeout_s="1", max_frame_bytes="65536", heartbeat_interval_s="1") as f:
        yield f


# ---------------------------------------------------------------- Postgres and Redis (tests/services.py)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A Postgres server for the session (`postgresql+asyncpg://`): ORRERY_TEST_POSTGRES_URL, else a
    throwaway one from the local binaries. Tests should take `postgres_db` to get a database of their own."""
    with postgres_server() as url:
        yield url


@pytest.fixture
def postgres_db(postgres_url: str) -> Iterator[str]:
    """A new, empty database for this test on the session's server (dropped afterwards); its URL."""
    with fresh_database(postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis server for the session: ORRERY_TEST_REDIS_URL, else a throwaway one."""
    with redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def _redis_databases(redis_url: str) -> RedisDatabases:
    return RedisDatabases.for_server(redis_url)


@pytest.fixture
def redis_db(_redis_databases: RedisDatabases) -> str:
    """A Redis URL whose database is empty at the start of this test."""
    return _redis_databases.next_url()


@pytest.fixture(scope="session", autouse=True)
def backend() -> Iterator[str]:
    """ORRERY_TEST_BACKEND=postgres: every `Fleet` of the session stores its state in Postgres."""
    import os

    if os.environ.get("ORRERY_TEST_BACKEND", "sqlite") != "postgres":
        yield "sqlite"
        return
    with postgres_server() as url:
        os.environ["ORRERY_TEST_POSTGRES_SERVER"] = url
        try:
            yield "postgres"
        finally:
            os.environ.pop("ORRERY_TEST_POSTGRES_SERVER", None)
