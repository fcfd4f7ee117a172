"""Async engine factory: SQLite (WAL, foreign keys, one writer) or Postgres via asyncpg."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(url: str) -> AsyncEngine:
    """Create the async engine; SQLite connections get WAL, foreign keys and a busy timeout."""
    kwargs: dict[str, Any] = {}
    if is_sqlite(url):
        kwargs["connect_args"] = {"timeout": 30}
    else:
        kwargs["pool_size"] = 10
        kwargs["max_overflow"] = 20
        kwargs["pool_pre_ping"] = True
    engine = create_async_engine(url, **kwargs)
    if is_sqlite(url):
        _sqlite_pragmas(engine.sync_engine)
    return engine


def _sqlite_pragmas(engine: Engine) -> None:
    """WAL for concurrent readers, foreign keys on, and NORMAL sync: in WAL mode that survives a
    killed process (the durability we promise), not a power cut."""

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
