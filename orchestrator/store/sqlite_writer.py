"""The group commit on SQLite, straight through the sqlite3 driver.

The engine commits once per step and waits for it, so the commit is on every dispatch's
critical path. Through SQLAlchemy's execution layer a typical step (an insert, four keyed
updates, five events) took ~1.4 ms; here it is a few hundred microseconds. SQLAlchemy still does
the type conversion: each column's own bind processor (JSON, UTC datetimes) is applied, so rows
read back through the ORM look exactly as if SQLAlchemy had written them.
"""

from __future__ import annotations

import contextlib
import operator
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import JSON, Table
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import make_url

from orchestrator.store.jsontext import json_text, json_value
from orchestrator.store.models import UTCDateTime
from orrery.checkpoints import Checkpoints

Convert = Callable[[Any], Any]
# Parameters in one statement: SQLite's limit before 3.32 (since, 32766); a multi-row insert stays below it.
MAX_VARIABLES = 999
Processor = Convert | None


class SqliteWriter:
    def __init__(self, url: str) -> None:
        self._dialect = sqlite.dialect()
        path = make_url(url).database or ":memory:"
        self._path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        # WAL, synchronous=NORMAL and checkpoints on a thread of their own: what that survives is
        # written at `orrery.checkpoints`.
        for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=NORMAL", "wal_autocheckpoint=0"):
            self._db.execute(f"PRAGMA {pragma}")
        self._cursor = self._db.cursor()  # the group commit's (one cursor, not one per statement)
        self._statements: dict[tuple[str, str, tuple[str, ...]], _Statement] = {}  # by (kind, table, columns)
        self._inserts: dict[tuple[str, tuple[str, ...]], tuple[_Statement, tuple[Any, ...]]] = {}  # by row shape
        self._readers: dict[tuple[str, tuple[str, ...]], tuple[str, list[tuple[str, Processor]]]] = {}
        self._checkpoints = Checkpoints(path) if path != ":memory:" else None

    def close(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.close()
        self._db.close()

    def write(
        self,
        inserts: list[tuple[Table, list[dict[str, Any]]]],
        updates: list[tuple[Table, list[tuple[tuple[Any, ...], dict[str, Any]]]]],
        events: tuple[Table, list[dict[str, Any]]] | None,
        deletes: list[tuple[Table, list[tuple[Any, ...]]]] | None = None,
    ) -> list[int]:
        """One transaction under BEGIN IMMEDIATE (we are the only writer inside it)."""
        cursor = self._cursor
        cursor.execute("BEGIN IMMEDIATE")
        try:
            for table, rows in inserts:
                for statement, params in self._insert_groups(table, rows).items():
                    statement.insert(cursor, params)
            for table, keyed in updates:
                for statement, params in self._update_groups(table, keyed).items():
                    _run(cursor, statement.sql, params)
            for table, keys in deletes or []:
                statement = self._statement("delete", table, ())
                _run(cursor, statement.sql, [statement.params({}, key) for key in keys])
            ids: list[int] = []
            if events is not None and events[1]:
                table, rows = events
                first = int(cursor.execute(self._statement("max_id", table, ()).sql).fetchone()[0]) + 1
                for offset, row in enumerate(rows):
                    row["id"] = first + offset
                    ids.append(first + offset)
                statement = self._statement("insert", table, tuple(rows[0]))
                statement.insert(cursor, [statement.params(r) for r in rows])
            cursor.execute("COMMIT")
            return ids
        except BaseException:
            cursor.execute("ROLLBACK")
            raise

    def _insert_groups(self, table: Table, rows: list[dict[str, Any]]) -> dict[_Statement, list[list[Any]]]:
        """Each insert statement (one per set of columns, defaults included) with its rows' parameters,
        in the order the first row of each appeared."""
        groups: dict[_Statement, list[list[Any]]] = {}
        for row in rows:
            shape = tuple(row)
            planned = self._inserts.get((table.name, shape))
            if planned is None:
                planned = self._inserts[(table.name, shape)] = self._insert_statement(table, shape)
            statement, defaults = planned
            params = statement.params(_with_defaults(row, defaults) if defaults else row)
            found = groups.get(statement)
            if found is None:
                groups[statement] = [params]
            else:
                found.append(params)
        return groups

    def _update_groups(
        self, table: Table, keyed: list[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> dict[_Statement, list[list[Any]]]:
        """Each update statement (one per set of columns) with its rows' parameters: the values,
        then the primary key."""
        groups: dict[_Statement, list[list[Any]]] = {}
        for key, values in keyed:
            statement = self._statement("update", table, tuple(values))
            params = statement.params(values, key)
            found = groups.get(statement)
            if found is None:
                groups[statement] = [params]
            else:
                found.append(params)
        return groups

    def _insert_statement(self, table: Table, shape: tuple[str, ...]) -> tuple[_Statement, tuple[Any, ...]]:
        """The insert of a row with the columns `shape`, and the columns it leaves out that have a
        default (applied as SQLAlchemy's own insert would)."""
        defaults = tuple(c for c in table.columns if c.name not in shape and c.default is not None)
        return self._statement("insert", table, (*shape, *(c.name for c in defaults))), defaults

    def execute(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """One statement in a transaction of its own (e.g. an atomic counter with RETURNING)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            rows = db.execute(sql, params).fetchall()
            db.execute("COMMIT")
            return rows
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Statements that commit together (e.g. a quota reserved with the row it is for): run
        them on the yielded connection, without awaiting in between; an exception rolls back."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """A read of committed rows on this connection (between transactions: never inside one)."""
        return self._db.execute(sql, params).fetchall()

    @property
    def in_memory(self) -> bool:
        """An in-memory database: only the writer's connection sees it (so only its thread)."""
        return self._path == ":memory:"

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A connection of its own holding one read transaction: its reads agree with each other
        and may run on another thread (a large read there leaves the loop free, where a read on
        the writer's connection would hold it). An in-memory database has only the writer's."""
        if self.in_memory:
            yield self._db
            return
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=30)
        try:
            db.execute("BEGIN")
            yield db
        finally:
            db.close()  # a read transaction has nothing to commit

    def read_rows(
        self,
        table: Table,
        where: str,
        params: tuple[Any, ...],
        order_by: str = "",
        columns: tuple[str, ...] = (),
        db: sqlite3.Connection | None = None,
    ) -> list[dict[str, Any]]:
        """Rows of `table` (column name -> value; every column, or those named) as the ORM would
        load them: each column's own result converter is applied (JSON parsed, UTC datetimes),
        without building ORM objects. `where` and `order_by` are SQL over the table's columns,
        with `?` for `params`; `db` is a `snapshot` to read in (else the writer's connection)."""
        names = columns or tuple(c.name for c in table.columns)
        plan = self._readers.get((table.name, names))
        if plan is None:
            converters = [
                (
                    name,
                    _fast_reader(table.c[name].type)
                    or table.c[name].type.dialect_impl(self._dialect).result_processor(self._dialect, None),
                )
                for name in names
            ]
            select_sql = f"SELECT {', '.join(self._q(n) for n in names)} FROM {self._q(table.name)}"
            plan = self._readers[(table.name, names)] = (select_sql, converters)
        select_sql, converters = plan
        sql = f"{select_sql} WHERE {where}" + (f" ORDER BY {order_by}" if order_by else "")
        return [
            {
                name: value if convert is None or value is None else convert(value)
                for (name, convert), value in zip(converters, row, strict=True)
            }
            for row in (db or self._db).execute(sql, params)
        ]

    def _q(self, name: str) -> str:
        return str(self._dialect.identifier_preparer.quote(name))

    def _statement(self, kind: str, table: Table, columns: tuple[str, ...]) -> _Statement:
        """The planned statement of `kind` (insert, update, delete) over `columns` of `table`."""
        statement = self._statements.get((kind, table.name, columns))
        if statement is None:
            statement = self._statements[(kind, table.name, columns)] = self._plan(kind, table, columns)
        return statement

    def _plan(self, kind: str, table: Table, columns: tuple[str, ...]) -> _Statement:
        name = self._q(table.name)
        pk = tuple(c.name for c in table.primary_key.columns)
        where = " AND ".join(f"{self._q(c)} = ?" for c in pk)
        if kind == "insert":
            names = ", ".join(self._q(c) for c in columns)
            sql = f"INSERT INTO {name} ({names}) VALUES ({', '.join('?' * len(columns))})"
        elif kind == "update":
            sets = ", ".join(f"{self._q(c)} = ?" for c in columns)
            sql = f"UPDATE {name} SET {sets} WHERE {where}"
        elif kind == "delete":
            sql = f"DELETE FROM {name} WHERE {where}"
        else:  # max_id: the highest id given so far (events are numbered in the commit)
            sql = f"SELECT coalesce(max(id), 0) FROM {name}"
        bound = columns if kind == "insert" else (*columns, *pk)  # an update or delete: then its key
        return _Statement(sql, columns, self._processors(table, bound))

    def _processors(self, table: Table, columns: tuple[str, ...]) -> tuple[tuple[int, Convert], ...]:
        """Which of `columns` go through a bind processor, with the processor: most need none."""
        processors = [
            _fast_processor(table.c[c].type)
            or table.c[c].type.dialect_impl(self._dialect).bind_processor(self._dialect)
            for c in columns
        ]
        return tuple((i, p) for i, p in enumerate(processors) if p is not None)


class _Statement:
    """One statement planned for one set of columns: its SQL, and how a row's parameters are made:
    its values read with one C-level getter, then the primary key for an update's or a delete's
    WHERE, each value that needs it through its column's bind processor (most need none)."""

    __slots__ = ("_multi", "_processed", "_take", "sql")

    def __init__(self, sql: str, columns: tuple[str, ...], processed: tuple[tuple[int, Convert], ...]) -> None:
        self.sql = sql
        self._multi: dict[int, str] = {}  # an insert's text for that many rows (see `insert`)
        getter = operator.itemgetter(*columns) if columns else None
        self._take: Callable[[dict[str, Any]], Any] = (
            (lambda row: ()) if getter is None else getter if len(columns) > 1 else (lambda row: (getter(row),))
        )
        self._processed = processed  # (index in the parameters, processor)

    def params(self, row: dict[str, Any], key: tuple[Any, ...] = ()) -> list[Any]:
        """The parameters of one row: its values in column order, then `key`, as bound."""
        values = [*self._take(row), *key]
        for i, process in self._processed:
            value = values[i]
            if value is not None:
                values[i] = process(value)
        return values

    def insert(self, cursor: sqlite3.Cursor, params: list[list[Any]]) -> None:
        """Insert rows, several in one statement (`INSERT ... VALUES (...), (...)`): the same rows
        in the same order as one statement per row, at a fraction of the driver's cost per row (a
        step inserts its events together)."""
        if len(params) == 1:
            cursor.execute(self.sql, params[0])
            return
        per = max(1, MAX_VARIABLES // len(params[0]))
        for start in range(0, len(params), per):
            rows = params[start : start + per]
            cursor.execute(self._multi_sql(len(rows)), [value for row in rows for value in row])

    def _multi_sql(self, rows: int) -> str:
        sql = self._multi.get(rows)
        if sql is None:
            head, _, group = self.sql.rpartition(" VALUES ")
            sql = self._multi[rows] = f"{head} VALUES {', '.join([group] * rows)}"
        return sql


def _with_defaults(row: dict[str, Any], defaults: tuple[Any, ...]) -> dict[str, Any]:
    """The row with the defaults of the columns it leaves out (a copy: the caller's row is kept)."""
    row = dict(row)
    for column in defaults:
        default: Any = column.default
        row[column.name] = default.arg(None) if default.is_callable else default.arg
    return row


def _run(cursor: sqlite3.Cursor, sql: str, params: list[list[Any]]) -> None:
    """One statement for each of `params` (a single row needs no executemany iteration)."""
    if len(params) == 1:
        cursor.execute(sql, params[0])
    else:
        cursor.executemany(sql, params)


def _fast_processor(type_: Any) -> Processor:
    """Faster equivalents of SQLAlchemy's converters for the two hot column types; each writes
    exactly the text SQLAlchemy would (checked by the store tests), ~5x quicker."""
    if isinstance(type_, JSON):
        return json_text
    if isinstance(type_, UTCDateTime):
        return sqlite_datetime
    return None


def _fast_reader(type_: Any) -> Processor:
    """Faster equivalents of SQLAlchemy's result converters: UTC datetimes, and JSON read as the
    standard library's loads reads it (SQLAlchemy's own), with orjson where the two agree."""
    if isinstance(type_, JSON):
        return json_value
    if isinstance(type_, UTCDateTime):
        return _load_datetime
    return None


@lru_cache(maxsize=1024)  # a step writes its one clock reading into many rows
def _load_datetime(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@lru_cache(maxsize=256)  # a step writes the same few times (its clock) into many rows
def sqlite_datetime(value: datetime) -> str:
    """SQLAlchemy's SQLite text of a datetime (in UTC when it is aware)."""
    v = value.astimezone(UTC) if value.tzinfo is not None else value
    # One %-format of a tuple: about half the instructions of an f-string of seven format specs.
    values = (v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond)
    return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % values  # noqa: UP031
