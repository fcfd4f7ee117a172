"""The schema migrations run up, down and up again on both backends, and match the models."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from orchestrator.store.db import make_engine
from orchestrator.store.migrate import downgrade, upgrade
from orchestrator.store.models import Base


async def _tables_and_diff(url: str) -> tuple[set[str], list[object]]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:

            def inspect_sync(sync_conn: object) -> tuple[set[str], list[object]]:
                tables = set(inspect(sync_conn).get_table_names())  # type: ignore[union-attr]
                ctx = MigrationContext.configure(sync_conn, opts={"compare_type": False})  # type: ignore[arg-type]
                return tables, list(compare_metadata(ctx, Base.metadata))

            return await conn.run_sync(inspect_sync)
    finally:
        await engine.dispose()


def _round_trip(url: str) -> None:
    upgrade(url)
    tables, diff = asyncio.run(_tables_and_diff(url))
    assert {"tasks", "nodes", "edges", "attempts", "events", "devices", "api_keys", "llm_calls"} <= tables
    assert diff == [], f"the migrations and the models disagree: {diff}"
    downgrade(url, "base")
    tables, _ = asyncio.run(_tables_and_diff(url))
    assert tables <= {"alembic_version"}
    upgrade(url)


def test_migrations_round_trip_on_sqlite(tmp_path: Path) -> None:
    _round_trip(f"sqlite+aiosqlite:///{tmp_path / 'm.db'}")


def test_migrations_round_trip_on_postgres(postgres_db: str) -> None:
    _round_trip(postgres_db)


__all__ = ["pytest"]
