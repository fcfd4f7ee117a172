"""One writing statement on either backend, in a transaction of its own (or a few that must
commit together: `transaction`).

Every artifact write is a single statement whose condition is part of it (`INSERT ... SELECT ...
WHERE the batch is open`, `... WHERE the staged end is this offset`), so it is atomic on both
backends and needs no transaction held across an `await`. On SQLite it goes through the store's
one writer connection (orchestrator/store/sqlite_writer.py: a second writing connection could
leave the engine's commits waiting on its lock); on Postgres through the async engine, each
parameter cast to its type (asyncpg cannot infer the type of a parameter in a select list).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import BigInteger, Boolean, LargeBinary, String, bindparam, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.types import TypeEngine

from orchestrator.store.models import UTCDateTime
from orchestrator.store.repo import Store, WriteConflict
from orchestrator.store.sqlite_writer import sqlite_datetime

_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


async def write(store: Store, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Run `sql` (named `:params`) in a transaction of its own; the rows it RETURNs. A broken
    uniqueness rule raises `WriteConflict` on both backends."""
    writer = store.sqlite
    try:
        if writer is not None:
            positional, names = _positional(sql)
            return writer.execute(positional, tuple(_sqlite_value(params[n]) for n in names))
        async with store.engine.begin() as conn:
            result = await conn.execute(_typed(sql, params), params)
            return [tuple(row) for row in result.fetchall()] if result.returns_rows else []
    except (sqlite3.IntegrityError, IntegrityError) as exc:
        if "unique" in str(exc).lower() or "duplicate" in str(exc).lower():
            raise WriteConflict(str(exc)) from exc
        raise


@dataclass(frozen=True)
class Step:
    """One statement of a `transaction`; a `required` one that RETURNs no row stops it."""

    sql: str
    params: Mapping[str, Any] = field(default_factory=dict)
    required: bool = True


class Stopped(Exception):
    """A required step of a `transaction` returned no row: nothing of it was committed."""

    def __init__(self, index: int) -> None:
        super().__init__(f"step {index} returned no row")
        self.index = index


async def transaction(store: Store, steps: Sequence[Step]) -> list[list[tuple[Any, ...]]]:
    """Run `steps` in order in one transaction; the rows each RETURNed. The first required step
    that returns none rolls all of them back and raises `Stopped` with its index (so a guard,
    e.g. a quota's conditional upsert, and the write it guards commit together or not at all)."""
    writer = store.sqlite
    out: list[list[tuple[Any, ...]]] = []
    try:
        if writer is not None:
            with writer.transaction() as db:  # no await inside: the writer's one connection
                for index, step in enumerate(steps):
                    positional, names = _positional(step.sql)
                    rows = db.execute(positional, tuple(_sqlite_value(step.params[n]) for n in names)).fetchall()
                    if step.required and not rows:
                        raise Stopped(index)
                    out.append(rows)
            return out
        async with store.engine.begin() as conn:
            for index, step in enumerate(steps):
                result = await conn.execute(_typed(step.sql, step.params), dict(step.params))
                rows = [tuple(row) for row in result.fetchall()] if result.returns_rows else []
                if step.required and not rows:
                    raise Stopped(index)
                out.append(rows)
        return out
    except (sqlite3.IntegrityError, IntegrityError) as exc:
        if "unique" in str(exc).lower() or "duplicate" in str(exc).lower():
            raise WriteConflict(str(exc)) from exc
        raise


@lru_cache(maxsize=64)
def _positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """`sql` with each `:name` as `?`, and the names in the order they appear (repeats kept)."""
    names = tuple(m.group(1) for m in _PARAM.finditer(sql))
    return _PARAM.sub("?", sql), names


def _sqlite_value(value: Any) -> Any:
    return sqlite_datetime(value) if isinstance(value, datetime) else value


def _typed(sql: str, params: Mapping[str, Any]) -> Any:
    return text(sql).bindparams(*(bindparam(name, type_=_type_of(value)) for name, value in params.items()))


def _type_of(value: Any) -> TypeEngine[Any]:
    if isinstance(value, bool):
        return Boolean()
    if isinstance(value, int):
        return BigInteger()
    if isinstance(value, bytes):
        return LargeBinary()
    if isinstance(value, datetime):
        return UTCDateTime()
    return String()
