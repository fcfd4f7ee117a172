"""The group commit on Postgres, most often in one round trip, through one asyncpg connection of
its own.

Through SQLAlchemy's pool a step's commit made a dozen round trips, each a network hop to a
Postgres elsewhere: the pool's ping on checkout (BEGIN, a query, ROLLBACK), BEGIN, the lease
check, one statement per table and set of columns, the events, COMMIT. Here a commit is one
statement, sent on its own (no `BEGIN`): Postgres runs it as a transaction of its own and commits
it before it answers, so one round trip writes the step. The statement:

- first reads and locks the engine lease's row (`FOR UPDATE`, when the commit is guarded): a
  writer whose lease was taken over or has expired fails the statement, so writes nothing, and a
  takeover waits for the commit to end;
- writes every row of the step: each insert, update and delete is a data-modifying CTE over
  `unnest` of one array per column (one statement whatever the number of rows), the events last,
  returning their ids in order.

A row updated or deleted in the step it was inserted in needs the insert to have run first (a
statement's CTEs all see the rows as they were when it started), so then the inserts go in a
statement of their own, which checks the lease, before the rest, in an explicit transaction:
`BEGIN`, the two statements, `COMMIT`, four round trips. Each column's value goes through the
column's own bind processor (as SQLAlchemy's insert would; JSON as the store's own compact text),
so the rows read back as the ones SQLAlchemy would have written. Errors come back as SQLAlchemy's
(`IntegrityError`, `DataError`, `DBAPIError` with `connection_invalidated` for a lost connection),
as the rest of the server reads them; a connection that failed or was interrupted
mid-transaction is dropped and made again.

The reads made after every commit (each event stream's) and on every request (its API key) go
through `PostgresReader`: one round trip each, on connections of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]  # no stubs; its objects are Any here
from sqlalchemy import JSON, Table
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.store.jsontext import json_text

Guard = tuple[str, str, int]  # (lease, holder, fence)
READERS = 4  # connections for the hot reads: event streams read after every commit, side by side
STATEMENT_CACHE = 512  # prepared statements kept: a commit's statement depends on which tables it touches
# The lease check, the commit's statement's first part: 1/0 (SQLSTATE 22012) when the lease row is
# not (name, holder, fence) unexpired; FOR UPDATE holds it until the commit ends, so no new leader
# can take the lease while this transaction writes. Its three parameters follow the rows' arrays.
_LEASE_CHECK = (
    "lease AS (SELECT 1 / count(*) AS held FROM (SELECT 1 FROM leases WHERE name = ${n}::text"
    " AND holder = ${n1}::text AND fence = ${n2}::bigint AND expires_at > now() FOR UPDATE) AS l)"
)
_DIVISION_BY_ZERO = "22012"
_LENGTH = re.compile(r"\(\d+\)")  # VARCHAR(40) -> VARCHAR
_CONNECT_ONLY = ("async_creator_fn", "prepared_statement_cache_size", "prepared_statement_name_func", "async_fallback")


class LeaseCheckFailed(Exception):
    """The lease row did not match the guard (the store raises `LeaseLost` for it)."""


class _OwnConnection:
    """One asyncpg connection held by this process (no pool: no ping on every checkout, no
    reset on every return), made on first use and again after it is lost; one user at a time."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._dialect = engine.dialect
        self._url = engine.url
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            cargs, cparams = self._dialect.create_connect_args(self._url)
            for name in _CONNECT_ONLY:
                cparams.pop(name, None)
            try:
                self._conn = await asyncpg.connect(*cargs, statement_cache_size=STATEMENT_CACHE, **cparams)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                raise DBAPIError("connect", None, exc, connection_invalidated=True) from exc
        return self._conn

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def _drop(self) -> None:
        """Forget the connection (its state is unknown): the next use makes a new one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def _twice(self, sql: str, call: Callable[[asyncpg.Connection], Awaitable[Any]]) -> Any:
        """`call` (one statement, `sql`) on the connection, one user at a time. A connection found
        lost is made again and `call` made once more: only for a statement that is safe to ask
        twice (a read; a lease statement, which decides from the row as it then is)."""
        async with self._lock:
            for attempt in (1, 2):
                conn = await self._connection()
                try:
                    return await call(conn)
                except asyncpg.PostgresError as exc:
                    if conn.is_closed():
                        self._drop()
                        if attempt == 1:
                            continue
                    raise _as_sqlalchemy(sql, exc, conn.is_closed()) from exc
                except asyncpg.DataError as exc:  # an argument it cannot send: the statement's fault
                    raise DataError(sql, None, exc) from exc
                except Exception as exc:  # the driver's own: the connection lost or unusable
                    self._drop()
                    if attempt == 1:
                        continue
                    raise DBAPIError(sql, None, exc, connection_invalidated=True) from exc
                except BaseException:
                    self._drop()  # cancelled while the statement was out: the connection is in doubt
                    raise
        raise AssertionError("unreachable")


class _ReaderConnection(_OwnConnection):
    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """The rows of one read. A connection found lost is made again and the read asked once
        more (a read changes nothing), as the pool's ping did."""
        return list(await self._twice(sql, lambda conn: conn.fetch(sql, *args)))


class PostgresReader:
    """The reads every open event stream makes after each commit, and every request's key check:
    one round trip each in autocommit (committed rows), where a pooled session made six (the
    pool's ping: BEGIN, a query, ROLLBACK; then BEGIN, the query, ROLLBACK). Up to READERS
    connections, made as needed: a read takes whichever is free first."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._made: list[_ReaderConnection] = []
        self._free: asyncio.Queue[_ReaderConnection] = asyncio.Queue()

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        if self._free.empty() and len(self._made) < READERS:
            self._made.append(_ReaderConnection(self._engine))
            reader = self._made[-1]
        else:
            reader = await self._free.get()
        try:
            return await reader.fetch(sql, *args)
        finally:
            self._free.put_nowait(reader)

    async def close(self) -> None:
        for reader in self._made:
            await reader.close()


# Take or renew a lease in one statement (its own transaction): taken only if free, ours,
# expired, or held by a session that is gone (its backend is not in `pg_stat_activity`: the
# process that opened it died, and Postgres ended the backend when the kernel closed its socket)
# since this Postgres started: a restart ends every session, the living holders' too, so a lease
# last renewed before it waits for its expiry (its holder reconnects and renews meanwhile). The
# row is made if there is none. A lease with no session recorded (renewed by a replica from
# before `holder_pid`) is taken only once it has expired. The fence goes up for a new holder; the
# session taking or renewing it, and when, are recorded. A row another transaction changes
# meanwhile is read again at its newest version before it is updated: of two replicas racing, one
# wins. A guarded commit holds the row (`FOR UPDATE`) until it ends, so a takeover waits for it; a
# refused try locks nothing, so it never holds up the leader's commits.
_ACQUIRE = """
WITH taken AS (
    UPDATE leases AS l SET
        holder = $2,
        fence = CASE WHEN l.holder = $2 THEN l.fence ELSE l.fence + 1 END,
        expires_at = now() + make_interval(secs => $3),
        holder_pid = pg_backend_pid(),
        renewed_at = now()
    WHERE l.name = $1 AND (l.holder = $2 OR l.holder IS NULL OR l.expires_at < now()
        OR (l.holder_pid IS NOT NULL AND l.renewed_at > pg_postmaster_start_time()
            AND NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = l.holder_pid)))
    RETURNING l.fence
), made AS (
    INSERT INTO leases (name, holder, fence, expires_at, holder_pid, renewed_at)
    SELECT $1, $2, 1, now() + make_interval(secs => $3), pg_backend_pid(), now()
    WHERE NOT EXISTS (SELECT 1 FROM leases WHERE name = $1)
    ON CONFLICT (name) DO NOTHING
    RETURNING fence
)
SELECT fence FROM taken UNION ALL SELECT fence FROM made
"""
_RELEASE = "UPDATE leases SET expires_at = now() WHERE name = $1 AND holder = $2"


class PostgresLease(_OwnConnection):
    """Leases taken, renewed and released on one connection held for the process's life: its
    backend's pid, recorded on the lease, says whether the holder lives (its session does as long
    as its process does). A lost connection is made again and the statement asked once more: a
    renewal with the new connection records its pid (a takeover in the gap is a failover: the
    writer's fenced commits and the next renewal find the lease lost)."""

    async def acquire(self, name: str, holder: str, ttl_s: float) -> int | None:
        found = await self._once(_ACQUIRE, name, holder, float(ttl_s))
        return int(found) if found is not None else None

    async def release(self, name: str, holder: str) -> None:
        await self._once(_RELEASE, name, holder)

    async def _once(self, sql: str, *args: Any) -> Any:
        return await self._twice(sql, lambda conn: conn.fetchval(sql, *args))


class PostgresWriter(_OwnConnection):
    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self._columns: dict[tuple[str, str], tuple[str, str, Callable[[Any], Any] | None]] = {}
        self._sql: dict[tuple[Any, ...], str] = {}  # by the shape of the statement's parts

    async def write(
        self,
        inserts: list[tuple[Table, list[dict[str, Any]]]],
        updates: list[tuple[Table, list[tuple[tuple[Any, ...], dict[str, Any]]]]],
        deletes: list[tuple[Table, list[tuple[Any, ...]]]],
        events: tuple[Table, list[dict[str, Any]]] | None,
        guard: Guard | None,
    ) -> list[int]:
        """One transaction; the ids given to the events, in order. Raises `LeaseCheckFailed` when
        the guard no longer holds (nothing written)."""
        statements = self._statements(inserts, updates, deletes, events, guard)
        if not statements:
            return []
        apart = len(statements) > 1  # an explicit transaction around them; else the one commits itself
        async with self._lock:
            conn = await self._connection()
            sql = "BEGIN"
            try:
                if apart:
                    await conn.execute(sql)
                ids: list[int] = []
                for i, (sql, args) in enumerate(statements):
                    try:
                        found = await conn.fetchval(sql, *args, column=int(guard is not None and i == 0))
                    except asyncpg.PostgresError as exc:
                        if guard is not None and i == 0 and exc.sqlstate == _DIVISION_BY_ZERO:
                            raise LeaseCheckFailed() from exc
                        raise
                    if isinstance(found, list):
                        ids = [int(i) for i in found]
                if apart:
                    sql = "COMMIT"
                    await conn.execute(sql)
                return ids
            except BaseException as exc:
                lost = not await self._rollback(conn, exc)
                if isinstance(exc, asyncpg.PostgresError):
                    raise _as_sqlalchemy(sql, exc, lost) from exc
                if isinstance(exc, asyncpg.DataError):  # a value it cannot send: the data's fault
                    raise DataError(sql, None, exc) from exc
                if isinstance(exc, Exception) and not isinstance(exc, LeaseCheckFailed):
                    # the driver's own (a connection lost, reset or closed under it, or left in a
                    # state it cannot go on from): the store out of reach, for the retry to decide
                    raise DBAPIError(sql, None, exc, connection_invalidated=True) from exc
                raise

    async def _rollback(self, conn: asyncpg.Connection, exc: BaseException) -> bool:
        """End a failed transaction (a statement sent on its own ended its own); whether the
        connection is kept. One in doubt (lost, or the write cancelled while a statement was out)
        is dropped instead."""
        if isinstance(exc, asyncpg.PostgresError | LeaseCheckFailed) and not conn.is_closed():
            try:
                if conn.is_in_transaction():
                    await asyncio.wait_for(conn.execute("ROLLBACK"), 5)
                return True
            except Exception:  # dropped below: the next write starts on a new connection
                pass
        self._drop()
        return False

    # ---------------------------------------------------------------- statements

    def _statements(
        self,
        inserts: list[tuple[Table, list[dict[str, Any]]]],
        updates: list[tuple[Table, list[tuple[tuple[Any, ...], dict[str, Any]]]]],
        deletes: list[tuple[Table, list[tuple[Any, ...]]]],
        events: tuple[Table, list[dict[str, Any]]] | None,
        guard: Guard | None,
    ) -> list[tuple[str, list[Any]]]:
        """The statements of a commit with their arguments: one, or two when a row inserted in
        it is also updated or deleted in it (the insert must come first); the first checks the
        lease when the commit is guarded."""
        first: list[tuple[Any, ...]] = []  # parts: (kind, table, columns, arrays)
        for table, rows in inserts:
            first.extend(self._insert_parts(table, rows))
        rest: list[tuple[Any, ...]] = []
        for table, keyed in updates:
            rest.extend(self._update_parts(table, keyed))
        for table, keys in deletes:
            if keys:
                pk = tuple(c.name for c in table.primary_key.columns)
                rest.append(("delete", table, pk, _columns_of(list(keys), len(pk))))
        if events is not None and events[1]:
            table, rows = events
            names = tuple(rows[0])
            rest.append(("events", table, names, self._arrays(table, names, [[r[n] for n in names] for r in rows])))
        if not first and not rest:
            return []
        if first and rest and _touched_again(inserts, updates, deletes):
            return [self._statement(first, guard), self._statement(rest, None)]
        return [self._statement(first + rest, guard)]

    def _insert_parts(self, table: Table, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        """One part per set of columns (defaults of the columns a row leaves out filled in, as
        SQLAlchemy's insert would), in the order each first appears."""
        groups: dict[tuple[str, ...], list[list[Any]]] = {}
        defaults = [c for c in table.columns if c.default is not None]
        for given in rows:
            row = given
            missing = [c for c in defaults if c.name not in row]
            if missing:
                row = dict(row)  # a copy: the caller's row is kept
                for column in missing:
                    default: Any = column.default
                    row[column.name] = default.arg(None) if default.is_callable else default.arg
            names = tuple(row)
            groups.setdefault(names, []).append([row[n] for n in names])
        return [("insert", table, names, self._arrays(table, names, values)) for names, values in groups.items()]

    def _update_parts(self, table: Table, keyed: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[tuple[Any, ...]]:
        """One part per set of columns set; its arrays: the key's columns, then the values."""
        pk = tuple(c.name for c in table.primary_key.columns)
        groups: dict[tuple[str, ...], list[list[Any]]] = {}
        for key, values in keyed:
            if not values:
                continue  # nothing to set
            names = tuple(values)
            groups.setdefault(names, []).append([*key, *values.values()])
        return [
            ("update", table, (*pk, *names), self._arrays(table, (*pk, *names), values))
            for names, values in groups.items()
        ]

    def _arrays(self, table: Table, names: tuple[str, ...], rows: list[list[Any]]) -> list[list[Any]]:
        """One array per column, each value through its column's bind processor."""
        arrays = _columns_of(rows, len(names))
        for i, name in enumerate(names):
            process = self._column(table, name)[2]
            if process is not None:
                arrays[i] = [process(v) for v in arrays[i]]
        return arrays

    def _column(self, table: Table, name: str) -> tuple[str, str, Callable[[Any], Any] | None]:
        """(quoted name, its SQL type, its bind processor) of a column."""
        found = self._columns.get((table.name, name))
        if found is None:
            column = table.c[name]
            found = self._columns[(table.name, name)] = (
                self._dialect.identifier_preparer.quote(name),
                # without a length: an explicit cast to VARCHAR(n) would cut a longer value short,
                # where storing it in the column refuses it (as an insert of the value itself does)
                _LENGTH.sub("", column.type.compile(dialect=self._dialect)),
                _processor(column.type, self._dialect),
            )
        return found

    def _statement(self, parts: list[tuple[Any, ...]], guard: Guard | None) -> tuple[str, list[Any]]:
        shape = (guard is not None, *((kind, table.name, names) for kind, table, names, _ in parts))
        sql = self._sql.get(shape)
        if sql is None:
            sql = self._sql[shape] = self._plan(parts, guard is not None)
        args = [array for *_, arrays in parts for array in arrays]
        if guard is not None:
            args.extend(guard)
        return sql, args

    def _plan(self, parts: list[tuple[Any, ...]], guarded: bool) -> str:
        """WITH [lease AS (...),] p0 AS (...), p1 AS (...) SELECT [the lease's check,] <the events'
        ids, in order, or NULL>. The check is the first thing the statement does: Postgres runs
        the main query's subqueries first, in order, and the parts it does not read after it."""
        ctes: list[str] = []
        n = 0  # parameters so far
        returns = "NULL"
        for i, (kind, table, names, _) in enumerate(parts):
            target = self._dialect.identifier_preparer.format_table(table)
            columns = [self._column(table, name) for name in names]
            source = ", ".join(f"${n + j + 1}::{sql_type}[]" for j, (_, sql_type, _) in enumerate(columns))
            alias = ", ".join(f"c{j}" for j in range(len(names)))
            n += len(names)
            quoted = ", ".join(q for q, _, _ in columns)
            if kind == "insert":
                body = f"INSERT INTO {target} ({quoted}) SELECT {alias} FROM unnest({source}) AS v({alias})"
            elif kind == "events":  # in the order given: ids grow with it
                body = (
                    f"INSERT INTO {target} ({quoted}) SELECT {alias} FROM unnest({source}) WITH ORDINALITY"
                    f" AS v({alias}, ord) ORDER BY ord RETURNING id"
                )
                returns = f"(SELECT array_agg(id ORDER BY id) FROM p{i})"
            else:
                pk = len(table.primary_key.columns)
                match = " AND ".join(f"t.{columns[j][0]} = v.c{j}" for j in range(pk))
                if kind == "update":
                    sets = ", ".join(f"{columns[j][0]} = v.c{j}" for j in range(pk, len(names)))
                    body = f"UPDATE {target} AS t SET {sets} FROM unnest({source}) AS v({alias}) WHERE {match}"
                else:
                    body = f"DELETE FROM {target} AS t USING unnest({source}) AS v({alias}) WHERE {match}"
            ctes.append(f"p{i} AS ({body})")
        if not guarded:
            return f"WITH {', '.join(ctes)} SELECT {returns}"
        lease = _LEASE_CHECK.format(n=n + 1, n1=n + 2, n2=n + 3)
        return f"WITH {lease}, {', '.join(ctes)} SELECT (SELECT held FROM lease), {returns}"


def _processor(type_: Any, dialect: Any) -> Callable[[Any], Any] | None:
    """The column type's bind processor; for JSON the store's own text (orjson, compact, as the
    SQLite writer writes it: about 5x quicker than the standard library's, and the same values
    read back), a None as SQLAlchemy would write it (JSON `null`, or SQL NULL if so declared)."""
    impl = type_.dialect_impl(dialect)
    if isinstance(impl, JSON):
        return _json_or_null if impl.none_as_null else json_text
    processor: Callable[[Any], Any] | None = impl.bind_processor(dialect)
    return processor


def _json_or_null(value: Any) -> str | None:
    return None if value is None else json_text(value)


def _columns_of(rows: list[Any], width: int) -> list[list[Any]]:
    """Rows (sequences of `width` values) as `width` columns."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


def _touched_again(
    inserts: list[tuple[Table, list[dict[str, Any]]]],
    updates: list[tuple[Table, list[tuple[tuple[Any, ...], dict[str, Any]]]]],
    deletes: list[tuple[Table, list[tuple[Any, ...]]]],
) -> bool:
    """Whether a row inserted in this commit is also updated or deleted in it."""
    new: dict[str, set[tuple[Any, ...]]] = {}
    for table, rows in inserts:
        pk = [c.name for c in table.primary_key.columns]
        new.setdefault(table.name, set()).update(tuple(row.get(c) for c in pk) for row in rows)
    for table, keyed in updates:
        if table.name in new and any(key in new[table.name] for key, _ in keyed):
            return True
    return any(table.name in new and any(key in new[table.name] for key in keys) for table, keys in deletes)


def _as_sqlalchemy(sql: str, exc: asyncpg.PostgresError, lost: bool) -> DBAPIError:
    """The error as SQLAlchemy raises it through its asyncpg driver, which the server reads:
    class 23 an IntegrityError, class 22 a DataError, any other a DBAPIError (with `orig` the
    driver's error, whose `sqlstate` the callers read); `lost`: the connection went with it."""
    state = str(exc.sqlstate or "")
    kind = IntegrityError if state.startswith("23") else DataError if state.startswith("22") else DBAPIError
    return kind(sql, None, exc, connection_invalidated=lost)
