"""Alembic environment: async engine, URL handed in by `orchestrator.store.migrate`."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from orchestrator.store.db import is_sqlite, make_engine
from orchestrator.store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=is_sqlite(str(connection.engine.url)),
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
            await conn.commit()
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    assert url, "orchestrator.store.migrate sets sqlalchemy.url"
    asyncio.run(_run_async(url))


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
