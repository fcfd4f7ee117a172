"""Repository: every query the orchestrator makes, and the engine's group commit."""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import orjson
from sqlalchemy import Table, case, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.store.db import is_sqlite, make_engine, make_sessionmaker
from orchestrator.store.jsontext import json_text
from orchestrator.store.models import (
    ApiKey,
    Approval,
    Attempt,
    Base,
    DagEdit,
    Device,
    DeviceHistory,
    Edge,
    Event,
    Lease,
    LlmCall,
    Node,
    NodeChild,
    Schedule,
    ScheduleTick,
    ServerMeta,
    Task,
)
from orchestrator.store.pg_writer import LeaseCheckFailed, PostgresLease, PostgresReader, PostgresWriter
from orchestrator.store.sqlite_writer import SqliteWriter, sqlite_datetime

UNDEFINED_TABLE = "42P01"  # Postgres's SQLSTATE for a table that does not exist

ACTIVE_TASK_STATES = ("planning", "running")
MIN_PREFIX = 4  # an id prefix shorter than this is not looked up (too many matches to be useful)
MAX_CANDIDATES = 10  # an ambiguous prefix names at most this many of its matches


class WriteConflict(Exception):
    """A write broke a uniqueness rule (e.g. an Idempotency-Key used concurrently)."""


class LeaseLost(Exception):
    """A fenced write found that its lease has moved on: the writer is no longer the owner."""


class StoredEvent:
    """A committed event as readers need it (ids grow with every commit).

    On SQLite the data comes as the JSON text the writer stored (`json_text`, compact, one line):
    an event stream writes that text as it is and parses it only if it must look inside."""

    __slots__ = ("_data", "_text", "id", "node_id", "type")

    def __init__(
        self, id: int, type: str, node_id: str | None, data: dict[str, Any] | None = None, text: str | None = None
    ) -> None:
        self.id, self.type, self.node_id = id, type, node_id
        self._data, self._text = data, text

    @property
    def data(self) -> dict[str, Any]:
        if self._data is None:
            # json, not orjson: orjson reads an int over 64 bits as a float
            self._data = (json.loads(self._text) if self._text else None) or {}
        return self._data

    @property
    def text(self) -> str:
        """The data as one line of compact JSON text (what `json_text` writes)."""
        if self._text is not None and "\n" not in self._text:
            return self._text
        return json_text(self.data)

    def __repr__(self) -> str:
        return f"StoredEvent(id={self.id}, type={self.type!r}, node_id={self.node_id!r})"


@dataclass
class ChangeSet:
    """Everything one engine step changes, written in one transaction."""

    inserts: dict[type[Base], list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    updates: dict[type[Base], dict[tuple[Any, ...], dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    events: list[dict[str, Any]] = field(default_factory=list)
    deletes: dict[type[Base], list[tuple[Any, ...]]] = field(default_factory=lambda: defaultdict(list))
    guard: tuple[str, str, int] | None = None  # (lease, holder, fence): write only while it still holds

    def delete(self, model: type[Base], key: tuple[Any, ...]) -> None:
        """Delete the row with primary key `key` (applied after inserts and updates)."""
        self.deletes[model].append(key)
        self.updates.get(model, {}).pop(key, None)

    def insert(self, model: type[Base], row: dict[str, Any]) -> None:
        self.inserts[model].append(row)

    def update(self, model: type[Base], key: tuple[Any, ...], **values: Any) -> None:
        """Merge `values` into the pending update of the row with primary key `key`."""
        self.merge(model, key, values)

    def merge(self, model: type[Base], key: tuple[Any, ...], values: dict[str, Any]) -> None:
        """`update` with the values as a dict (which is copied, never kept)."""
        rows = self.updates[model]
        pending = rows.get(key)
        if pending is None:
            rows[key] = dict(values)
        else:
            pending.update(values)

    def event(self, row: dict[str, Any]) -> None:
        self.events.append(row)

    def absorb(self, later: ChangeSet) -> None:
        """Add the changes of `later` (made after ours) to this set, as if made here in order:
        its inserts, updates (its values win on the same row), deletes and events all land, and
        its guard applies to the whole."""
        for model, rows in later.inserts.items():
            self.inserts[model].extend(rows)
        for model, by_key in later.updates.items():
            for key, values in by_key.items():
                self.merge(model, key, values)
        for model, keys in later.deletes.items():
            for key in keys:
                self.delete(model, key)
        self.events.extend(later.events)
        self.guard = later.guard

    def __bool__(self) -> bool:
        return bool(self.inserts or self.updates or self.events or self.deletes)


_INSERT_ORDER: tuple[type[Base], ...] = (
    ApiKey,
    Device,
    Task,
    Node,
    NodeChild,
    Edge,
    Attempt,
    Approval,
    DagEdit,
    LlmCall,
    DeviceHistory,
    Schedule,
    ScheduleTick,
)
_INSERT_RANK = {model: rank for rank, model in enumerate(_INSERT_ORDER)}


@dataclass
class TaskBundle:
    task: Task
    nodes: list[Node]
    edges: list[Edge]
    attempts: list[Attempt]
    children: list[NodeChild] = field(default_factory=list)  # fan-out children, by position


# The columns of a task's nodes and attempts that its view shows.
VIEW_NODE_COLUMNS = (
    *("id", "kind", "state", "spec", "queued_on", "output", "error", "started_at", "finished_at"),
    *("fan_out", "verification"),
)
VIEW_CHILD_COLUMNS = (
    *("node_id", "device_id", "device_name", "state", "output", "error", "verification"),
    *("queued_on", "started_at", "finished_at"),
)
VIEW_ATTEMPT_COLUMNS = (
    "kind",
    "node_id",
    "n",
    "device_id",
    "batch_id",
    "status",
    "started_at",
    "accepted_at",
    "ended_at",
    "commands",
    "results",
    "error",
)


@dataclass
class TaskRows:
    """A task as plain rows (column name -> value, as the ORM would load it), for reading only:
    the API renders a task of thousands of nodes from these without building ORM objects. The
    task row is whole; nodes and attempts have the VIEW_*_COLUMNS."""

    task: dict[str, Any]
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    children: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RuntimeSnapshot:
    devices: list[Device]
    tasks: list[TaskBundle]


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: AsyncEngine = make_engine(url)
        self.sessions = make_sessionmaker(self.engine)
        # SQLite: the engine's group commits go through one plain sqlite3 connection on one
        # thread, a single thread hop per transaction (aiosqlite hops once per statement, which
        # made a commit ~10x slower). Postgres keeps the async driver.
        self._sqlite: SqliteWriter | None = None
        self._postgres: PostgresWriter | None = None
        self._reader: PostgresReader | None = None
        self._lease: PostgresLease | None = None
        if is_sqlite(url):
            self._sqlite = SqliteWriter(url)
        else:  # the group commit in one round trip (most often), the hot reads in one, on connections of their own
            self._postgres = PostgresWriter(self.engine)
            self._reader = PostgresReader(self.engine)
            self._lease = PostgresLease(self.engine)  # its session says the holder lives

    @property
    def sqlite(self) -> SqliteWriter | None:
        """The SQLite writer's connection (None on Postgres): a conditional write of one row
        goes through it, so it never waits on a second SQLite connection's lock."""
        return self._sqlite

    async def close(self) -> None:
        for own in (self._postgres, self._reader, self._lease):
            if own is not None:
                await own.close()
        await self.engine.dispose()
        if self._sqlite is not None:
            self._sqlite.close()

    async def server_id(self) -> str:
        """The identity of this store (made by the migrations), shared by every replica."""
        async with self.sessions() as s:
            row = await s.get(ServerMeta, "server_id")
        return row.value if row is not None else ""

    async def open_session(self, device_id: str) -> int:
        """Start a new connection epoch for a device; the epoch, or 0 if the device is gone.

        One atomic increment in the store orders every connection of a device across replicas:
        whoever holds the highest epoch holds its current session (SPEC section 7)."""
        if self._sqlite is not None:
            rows = self._sqlite.execute(
                "UPDATE devices SET session_epoch = session_epoch + 1 WHERE id = ? RETURNING session_epoch",
                (device_id,),
            )
            return int(rows[0][0]) if rows else 0
        devices = _table(Device)
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    update(devices)
                    .where(devices.c.id == device_id)
                    .values(session_epoch=devices.c.session_epoch + 1)
                    .returning(devices.c.session_epoch)
                )
            ).first()
        return int(row[0]) if row else 0

    async def active_task_ids(self, created_since: datetime) -> list[tuple[str, str]]:
        """(id, state) of planning and running tasks created since the given time."""
        if self._sqlite is not None:  # the engine asks this every few seconds: no thread hop (see `events_after`)
            marks = ", ".join("?" * len(ACTIVE_TASK_STATES))
            rows = self._sqlite.read(
                f"SELECT id, state FROM tasks WHERE state IN ({marks}) AND created_at >= ?",
                (*ACTIVE_TASK_STATES, sqlite_datetime(created_since)),
            )
            return [(str(i), str(st)) for i, st in rows]
        q = select(Task.id, Task.state).where(Task.state.in_(ACTIVE_TASK_STATES), Task.created_at >= created_since)
        async with self.sessions() as s:
            return [(str(i), str(st)) for i, st in (await s.execute(q)).all()]

    async def device_admin(
        self, after: str = "", limit: int = 1_000_000
    ) -> list[tuple[str, str, str, dict[str, Any], str]]:
        """(id, name, admin state, enrollment labels, token hash) of the devices after id `after`,
        at most `limit`, in id order: what operators change."""
        if self._sqlite is not None:
            rows = self._sqlite.read(
                "SELECT id, name, admin_state, labels, token_hash FROM devices WHERE id > ? ORDER BY id LIMIT ?",
                (after, limit),
            )
            return [(str(i), str(n), str(a), _json_object(lb), str(t)) for i, n, a, lb, t in rows]
        q = (
            select(Device.id, Device.name, Device.admin_state, Device.labels, Device.token_hash)
            .where(Device.id > after)
            .order_by(Device.id)
            .limit(limit)
        )
        async with self.sessions() as s:
            return [(str(i), str(n), str(a), dict(lb or {}), str(t)) for i, n, a, lb, t in (await s.execute(q)).all()]

    async def ping(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(select(1))

    # ------------------------------------------------------------------ group commit

    async def write(self, changes: ChangeSet) -> list[int]:
        """Apply a change set atomically; returns the ids given to its events, in order.

        Every write of the orchestrator comes here. On SQLite it runs on the event loop's own
        thread through one connection: a short transaction beats a thread hop (whose GIL hand-over
        alone cost more than the commit), and with a single writer no transaction can ever wait
        on another one that needs the loop to finish. On Postgres it is one statement, one round trip,
        on a connection of its own (`PostgresWriter`). With a `guard`, the transaction first
        checks (and locks) the lease row: a writer whose lease was taken over writes nothing and
        gets `LeaseLost` (SPEC section 7: fencing). Raises `WriteConflict` on a uniqueness clash.
        """
        try:
            if self._sqlite is not None:
                return self._sqlite.write(
                    _inserts_in_order(changes.inserts),
                    [(_table(m), list(by_key.items())) for m, by_key in changes.updates.items()],
                    (_table(Event), changes.events) if changes.events else None,
                    [(_table(m), keys) for m, keys in changes.deletes.items() if keys],
                )
            assert self._postgres is not None
            return await self._postgres.write(
                _inserts_in_order(changes.inserts),
                [(_table(m), list(by_key.items())) for m, by_key in changes.updates.items() if by_key],
                [(_table(m), keys) for m, keys in changes.deletes.items() if keys],
                (_table(Event), changes.events) if changes.events else None,
                changes.guard,
            )
        except LeaseCheckFailed as exc:
            name, holder, fence = changes.guard or ("", "", 0)
            raise LeaseLost(f"lease '{name}' (fence {fence}) is no longer held by {holder}") from exc
        except (sqlite3.IntegrityError, IntegrityError) as exc:
            if "unique" in str(exc).lower():
                raise WriteConflict(str(exc)) from exc
            raise

    # ------------------------------------------------------------------ auth

    async def find_api_key(self, key_hash: str) -> tuple[str, str] | None:
        """(id, role) of the unrevoked API key with this hash, or None.

        Every REST request asks this, so it is read like `events_after`: on SQLite straight from
        the writer's connection on this thread (an indexed read; through the ORM it was a session,
        a thread hop and a rollback, slowest exactly when the engine keeps the loop busy), on
        Postgres in one round trip on the reader's own connection (`PostgresReader`)."""
        if self._sqlite is not None:
            rows = self._sqlite.read(
                "SELECT id, role FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL", (key_hash,)
            )
            return (str(rows[0][0]), str(rows[0][1])) if rows else None
        assert self._reader is not None
        found = await self._reader.fetch(
            "SELECT id, role FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", key_hash
        )
        return (str(found[0][0]), str(found[0][1])) if found else None

    async def api_key_active(self, key_id: str) -> bool:
        """Whether key `key_id` exists and is not revoked (long-lived streams re-check their key)."""
        if self._sqlite is not None:
            return bool(self._sqlite.read("SELECT 1 FROM api_keys WHERE id = ? AND revoked_at IS NULL", (key_id,)))
        assert self._reader is not None
        return bool(await self._reader.fetch("SELECT 1 FROM api_keys WHERE id = $1 AND revoked_at IS NULL", key_id))

    async def count_api_keys(self) -> int:
        async with self.sessions() as s:
            return int((await s.execute(select(func.count()).select_from(ApiKey))).scalar_one())

    async def add(self, model: type[Base], row: dict[str, Any]) -> None:
        """Insert one row (all writes go through `write`, one writer at a time)."""
        changes = ChangeSet()
        changes.insert(model, row)
        await self.write(changes)

    async def update(self, model: type[Base], key: tuple[Any, ...], **values: Any) -> None:
        changes = ChangeSet()
        changes.update(model, key, **values)
        await self.write(changes)

    async def revoke_api_key(self, key_id: str, at: datetime) -> bool:
        async with self.sessions() as s:
            key = await s.get(ApiKey, key_id)
        if key is None or key.revoked_at is not None:
            return False
        await self.update(ApiKey, (key_id,), revoked_at=at)
        return True

    # ------------------------------------------------------------------ devices

    async def find_device_by_token(self, token_hash: str) -> Device | None:
        async with self.sessions() as s:
            return await s.scalar(select(Device).where(Device.token_hash == token_hash))

    async def get_device(self, device_id: str) -> Device | None:
        async with self.sessions() as s:
            return await s.get(Device, device_id)

    async def find_device_by_name(self, name: str) -> Device | None:
        """The device that holds `name`: the one not revoked (revoked ones free their name)."""
        async with self.sessions() as s:
            return await s.scalar(select(Device).where(Device.name == name, Device.admin_state != "revoked"))

    async def resolve_device(self, ref: str) -> tuple[Device | None, list[Device]]:
        """The device `ref` names: its id, its name (the device not revoked) or a unique id prefix
        of at least `MIN_PREFIX` characters. (device, []) when found; (None, candidates) when
        the prefix is ambiguous; (None, []) when nothing matches."""
        row = await self.get_device(ref)
        if row is None:
            row = await self.find_device_by_name(ref)
        if row is not None:
            return row, []
        if len(ref) < MIN_PREFIX:
            return None, []
        q = select(Device).where(_id_prefix(Device.id, ref, "dev")).order_by(Device.id).limit(MAX_CANDIDATES)
        async with self.sessions() as s:
            rows = list((await s.execute(q)).scalars().all())
        return (rows[0], []) if len(rows) == 1 else (None, rows)

    async def device_history(
        self, device_id: str, limit: int, cursor: str | None
    ) -> tuple[list[DeviceHistory], str | None]:
        """Newest first, keyset-paginated on the row id."""
        q = (
            select(DeviceHistory)
            .where(DeviceHistory.device_id == device_id)
            .order_by(DeviceHistory.id.desc())
            .limit(limit + 1)
        )
        if cursor:
            _, last = decode_cursor(cursor)
            if not last.isdigit():
                raise BadCursor("the cursor is not one this server issued; start again without it")
            q = q.where(DeviceHistory.id < int(last))
        async with self.sessions() as s:
            rows = list((await s.execute(q)).scalars().all())
        nxt = encode_cursor(rows[limit - 1].at, str(rows[limit - 1].id)) if len(rows) > limit else None
        return rows[:limit], nxt

    async def last_device_state(self, device_id: str) -> str | None:
        """The newest state recorded in the device's history."""
        q = (
            select(DeviceHistory.state)
            .where(DeviceHistory.device_id == device_id)
            .order_by(DeviceHistory.id.desc())
            .limit(1)
        )
        async with self.sessions() as s:
            value = await s.scalar(q)
        return str(value) if value is not None else None

    async def _oldest_kept_history(self, device_ids: Sequence[str], keep: int) -> list[tuple[str, int]]:
        """(device, id of its `keep`-th newest history row) for each device that has that many."""
        found: list[tuple[str, Any]] = []
        if self._sqlite is not None:
            sql = "SELECT id FROM device_history WHERE device_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?"
            for device_id in device_ids:
                rows = self._sqlite.read(sql, (device_id, keep - 1))
                found.append((device_id, rows[0][0] if rows else None))
        else:
            history = _table(DeviceHistory)
            async with self.sessions() as s:  # one session for them all
                for device_id in device_ids:
                    q = select(history.c.id).where(history.c.device_id == device_id).order_by(history.c.id.desc())
                    found.append((device_id, await s.scalar(q.offset(keep - 1).limit(1))))
        return [(device_id, int(oldest)) for device_id, oldest in found if oldest is not None]

    async def prune_device_history(self, device_ids: Sequence[str], keep: int) -> int:
        """Delete all but the newest `keep` history rows of each device; how many went."""
        history = _table(DeviceHistory)
        cut = await self._oldest_kept_history(device_ids, keep)
        removed = 0
        for device_id, oldest_kept in cut:
            if self._sqlite is not None:
                removed += len(
                    self._sqlite.execute(
                        "DELETE FROM device_history WHERE device_id = ? AND id < ? RETURNING id",
                        (device_id, oldest_kept),
                    )
                )
                continue
            async with self.engine.begin() as conn:
                result = await conn.execute(
                    history.delete().where(history.c.device_id == device_id, history.c.id < oldest_kept)
                )
                removed += int(result.rowcount or 0)
        return removed

    async def device_attempts(
        self, device_id: str, limit: int, cursor: str | None
    ) -> tuple[list[tuple[Attempt, str]], str | None]:
        """(attempt, task name) of the batches sent to a device, newest first, keyset-paginated
        on (started_at, batch_id)."""
        q = (
            select(Attempt, Task.name)
            .join(Task, Task.id == Attempt.task_id)
            .where(Attempt.device_id == device_id)
            .order_by(Attempt.started_at.desc(), Attempt.batch_id.desc())
            .limit(limit + 1)
        )
        if cursor:
            at, bid = decode_cursor(cursor)
            q = q.where((Attempt.started_at < at) | ((Attempt.started_at == at) & (Attempt.batch_id < bid)))
        async with self.sessions() as s:
            rows = [(a, str(name)) for a, name in (await s.execute(q)).all()]
        nxt = None
        if len(rows) > limit:
            last = rows[limit - 1][0]
            nxt = encode_cursor(last.started_at, last.batch_id)
        return rows[:limit], nxt

    async def current_work(self, batch_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        """batch id -> (task id, node id) of the batches devices are running now."""
        if not batch_ids:
            return {}
        q = select(Attempt.batch_id, Attempt.task_id, Attempt.node_id).where(Attempt.batch_id.in_(batch_ids))
        async with self.sessions() as s:
            return {str(b): (str(t), str(n)) for b, t, n in (await s.execute(q)).all()}

    async def list_devices(self) -> list[Device]:
        async with self.sessions() as s:
            return list((await s.execute(select(Device).order_by(Device.name))).scalars().all())

    async def device_catalog_version(self) -> int | None:
        """Grows with every committed change submission checks read of the devices (migration
        0013's triggers): one round trip (`PostgresReader`). None where no version is kept: on
        SQLite (one process there checks against its engine's memory), and on a schema from
        before 0013 (a replica started before the migration ran reads every row meanwhile)."""
        if self._sqlite is not None:
            return None
        assert self._reader is not None
        try:
            rows = await self._reader.fetch("SELECT version FROM device_catalog WHERE id = 1")
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) == UNDEFINED_TABLE:
                return None
            raise
        return int(rows[0][0]) if rows else None

    async def queue_lengths(self) -> dict[str, int]:
        async with self.sessions() as s:
            rows = await s.execute(
                select(Node.queued_on, func.count())
                .where(Node.state == "queued", Node.queued_on.is_not(None))
                .group_by(Node.queued_on)
            )
            return {str(d): int(n) for d, n in rows.all()}

    # ------------------------------------------------------------------ tasks

    async def get_task(self, task_id: str) -> TaskBundle | None:
        async with self.sessions() as s:
            task = await s.get(Task, task_id)
            if task is None:
                return None
            nodes = (await s.execute(select(Node).where(Node.task_id == task_id).order_by(Node.position))).scalars()
            edges = (await s.execute(select(Edge).where(Edge.task_id == task_id))).scalars()
            attempts = (
                await s.execute(select(Attempt).where(Attempt.task_id == task_id).order_by(Attempt.n))
            ).scalars()
            q = select(NodeChild).where(NodeChild.task_id == task_id).order_by(NodeChild.node_id, NodeChild.position)
            children = (await s.execute(q)).scalars()
            return TaskBundle(task, list(nodes), list(edges), list(attempts), list(children))

    async def task_view(self, task_id: str) -> TaskBundle | TaskRows | None:
        """The task with its nodes, edges and attempts, to show. On SQLite as plain rows, only
        the columns shown, in one read transaction on a thread (a finished 2,000-node task took
        ~0.35 s through the ORM, ~0.15 s so, and the loop answers heartbeats meanwhile); on
        Postgres through the ORM."""
        sqlite = self._sqlite
        if sqlite is None:
            return await self.get_task(task_id)

        def read() -> TaskRows | None:
            with sqlite.snapshot() as db:
                tasks = sqlite.read_rows(_table(Task), "id = ?", (task_id,), db=db)
                if not tasks:
                    return None
                where = ("task_id = ?", (task_id,))
                return TaskRows(
                    tasks[0],
                    sqlite.read_rows(_table(Node), *where, "position", VIEW_NODE_COLUMNS, db=db),
                    sqlite.read_rows(_table(Edge), *where, db=db),
                    sqlite.read_rows(_table(Attempt), *where, "n", VIEW_ATTEMPT_COLUMNS, db=db),
                    sqlite.read_rows(_table(NodeChild), *where, "node_id, position", VIEW_CHILD_COLUMNS, db=db),
                )

        return read() if sqlite.in_memory else await asyncio.to_thread(read)

    async def resolve_task(self, ref: str) -> tuple[Task | None, list[Task]]:
        """The task `ref` names: its id, its name (the newest task of that name) or a unique id
        prefix of at least `MIN_PREFIX` characters; see `resolve_device`."""
        async with self.sessions() as s:
            row = await s.get(Task, ref)
            if row is None:
                q = select(Task).where(Task.name == ref).order_by(Task.created_at.desc(), Task.id.desc()).limit(1)
                row = await s.scalar(q)
            if row is not None:
                return row, []
            if len(ref) < MIN_PREFIX:
                return None, []
            q = select(Task).where(_id_prefix(Task.id, ref, "task")).order_by(Task.id).limit(MAX_CANDIDATES)
            rows = list((await s.execute(q)).scalars().all())
        return (rows[0], []) if len(rows) == 1 else (None, rows)

    async def find_admitted(self, task_id: str, key: str | None) -> Task | None:
        """The task with this id, or else the one made with this Idempotency-Key (the engine's
        check before it inserts a submission: a re-asked submission must not be made twice)."""
        async with self.sessions() as s:
            found = await s.scalar(select(Task).where(Task.id == task_id))
            if found is None and key:
                found = await s.scalar(select(Task).where(Task.idempotency_key == key))
            return found

    async def find_task_by_idempotency_key(self, key: str) -> Task | None:
        async with self.sessions() as s:
            return await s.scalar(select(Task).where(Task.idempotency_key == key))

    async def list_tasks(self, state: str | None, limit: int, cursor: str | None) -> tuple[list[Task], str | None]:
        """Newest first, keyset-paginated on (created_at, id)."""
        q = select(Task).order_by(Task.created_at.desc(), Task.id.desc()).limit(limit + 1)
        if state:
            q = q.where(Task.state == state)
        if cursor:
            at, tid = decode_cursor(cursor)
            q = q.where((Task.created_at < at) | ((Task.created_at == at) & (Task.id < tid)))
        async with self.sessions() as s:
            rows = list((await s.execute(q)).scalars().all())
        nxt = encode_cursor(rows[limit - 1].created_at, rows[limit - 1].id) if len(rows) > limit else None
        return rows[:limit], nxt

    async def task_node_counts(self, task_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        if not task_ids:
            return {}
        async with self.sessions() as s:
            rows = await s.execute(
                select(Node.task_id, Node.state, func.count())
                .where(Node.task_id.in_(task_ids))
                .group_by(Node.task_id, Node.state)
            )
            out: dict[str, dict[str, int]] = defaultdict(dict)
            for tid, st, n in rows.all():
                out[str(tid)][str(st)] = int(n)
            return out

    async def task_state(self, task_id: str) -> str | None:
        """The task's state alone (an event reader asks whether more can come)."""
        if self._sqlite is not None:
            rows = self._sqlite.read("SELECT state FROM tasks WHERE id = ?", (task_id,))
            return str(rows[0][0]) if rows else None
        assert self._reader is not None
        found = await self._reader.fetch("SELECT state FROM tasks WHERE id = $1", task_id)
        return str(found[0][0]) if found else None

    async def events_after(self, task_id: str, after: int, limit: int = 1000) -> list[StoredEvent]:
        """Task `task_id`'s events with ids above `after`, oldest first, at most `limit`.

        Every open event stream asks this after each commit that touches its task, so it is
        read without the ORM: on SQLite straight from the writer's connection on this thread
        (an indexed read of committed rows, ~50 us, where the ORM and a thread hop cost ~1 ms of
        CPU and contended for the GIL with the engine), on Postgres in one round trip on the
        reader's own connection (`PostgresReader`)."""
        if self._sqlite is not None:
            rows = self._sqlite.read(
                "SELECT id, type, node_id, data FROM events WHERE task_id = ? AND id > ? ORDER BY id LIMIT ?",
                (task_id, after, limit),
            )
            return [StoredEvent(int(i), str(t), n, text=d) for i, t, n, d in rows]
        assert self._reader is not None
        rows = await self._reader.fetch(
            "SELECT id, type, node_id, data FROM events WHERE task_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            task_id,
            after,
            limit,
        )
        # the JSON as stored (asyncpg hands it over as text): parsed only if a reader looks inside
        return [StoredEvent(int(i), str(t), n, text=d if d != "null" else None) for i, t, n, d in rows]

    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> int | None:
        """Take or renew lease `name` for `holder`; its fence (bumped on a new holder), or None.

        One conditional statement decides: it succeeds only if the lease is free, expired,
        already ours or (on Postgres) held by a session that is gone, so two replicas can never
        both win (SPEC section 7). Times are the database's. On Postgres it runs on a connection
        this store holds for its life (`PostgresLease`), whose backend it records on the lease:
        that session ends when this process dies, and then the lease may be taken at once
        rather than at its expiry (safe: every guarded commit checks the fence)."""
        if self._lease is not None:
            return await self._lease.acquire(name, holder, ttl_s)
        leases = _table(Lease)
        expires = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, ttl_s)
        async with self.engine.begin() as conn:
            await conn.execute(
                postgres_insert(leases)
                .values(name=name, holder=None, fence=0, expires_at=None)
                .on_conflict_do_nothing(index_elements=["name"])
            )
            row = (
                await conn.execute(
                    update(leases)
                    .where(leases.c.name == name)
                    .where(or_(leases.c.holder == holder, leases.c.holder.is_(None), leases.c.expires_at < func.now()))
                    .values(
                        holder=holder,
                        expires_at=expires,
                        fence=case((leases.c.holder == holder, leases.c.fence), else_=leases.c.fence + 1),
                    )
                    .returning(leases.c.fence)
                )
            ).first()
            return int(row[0]) if row else None

    async def release_lease(self, name: str, holder: str) -> None:
        if self._lease is not None:
            await self._lease.release(name, holder)
            return
        leases = _table(Lease)
        async with self.engine.begin() as conn:
            await conn.execute(
                update(leases).where(leases.c.name == name, leases.c.holder == holder).values(expires_at=func.now())
            )

    async def lease_holder(self, name: str) -> str | None:
        async with self.sessions() as s:
            lease = await s.get(Lease, name)
            return lease.holder if lease is not None else None

    async def llm_calls(self, task_id: str) -> list[LlmCall]:
        async with self.sessions() as s:
            q = select(LlmCall).where(LlmCall.task_id == task_id).order_by(LlmCall.id)
            return list((await s.execute(q)).scalars().all())

    async def dag_edits(self, task_id: str) -> list[DagEdit]:
        async with self.sessions() as s:
            q = select(DagEdit).where(DagEdit.task_id == task_id).order_by(DagEdit.version)
            return list((await s.execute(q)).scalars().all())

    async def find_attempt(self, batch_id: str) -> Attempt | None:
        async with self.sessions() as s:
            return await s.get(Attempt, batch_id)

    async def find_approval(self, approval_id: str) -> Approval | None:
        async with self.sessions() as s:
            return await s.get(Approval, approval_id)

    async def approvals_to_restore(self) -> list[Approval]:
        """The engine's recovery: every approval its device has not reported decided yet, and
        every approval of an attempt still open (decided or not)."""
        open_attempts = select(Attempt.batch_id).where(Attempt.ended_at.is_(None))
        q = select(Approval).where(or_(Approval.state == "pending", Approval.batch_id.in_(open_attempts)))
        async with self.sessions() as s:
            return list((await s.execute(q.order_by(Approval.created_at, Approval.id))).scalars())

    # ------------------------------------------------------------------ recovery

    async def load_runtime(self) -> RuntimeSnapshot:
        """Everything the engine needs after a (re)start: devices, unfinished tasks, their attempts."""
        async with self.sessions() as s:
            devices = list((await s.execute(select(Device))).scalars().all())
            tasks = list((await s.execute(select(Task).where(Task.state.in_(ACTIVE_TASK_STATES)))).scalars())
            ids = [t.id for t in tasks]
            nodes: dict[str, list[Node]] = defaultdict(list)
            edges: dict[str, list[Edge]] = defaultdict(list)
            attempts: dict[str, list[Attempt]] = defaultdict(list)
            children: dict[str, list[NodeChild]] = defaultdict(list)
            for chunk in _chunks(ids, 500):
                for n in (
                    await s.execute(select(Node).where(Node.task_id.in_(chunk)).order_by(Node.position))
                ).scalars():
                    nodes[n.task_id].append(n)
                for e in (await s.execute(select(Edge).where(Edge.task_id.in_(chunk)))).scalars():
                    edges[e.task_id].append(e)
                q = select(Attempt).where(Attempt.task_id.in_(chunk)).order_by(Attempt.n)
                for a in (await s.execute(q)).scalars():
                    attempts[a.task_id].append(a)
                kids = select(NodeChild).where(NodeChild.task_id.in_(chunk)).order_by(NodeChild.position)
                for c in (await s.execute(kids)).scalars():
                    children[c.task_id].append(c)
            bundles = [TaskBundle(t, nodes[t.id], edges[t.id], attempts[t.id], children[t.id]) for t in tasks]
            return RuntimeSnapshot(devices, bundles)


def _inserts_in_order(inserts: dict[type[Base], list[dict[str, Any]]]) -> list[tuple[Table, list[dict[str, Any]]]]:
    """Each model's new rows, parents before children, in `_INSERT_ORDER` (sorting the few models a
    commit has, not walking the whole order)."""
    models = sorted((m for m, rows in inserts.items() if rows and m in _INSERT_RANK), key=_INSERT_RANK.__getitem__)
    return [(_table(m), inserts[m]) for m in models]


def _id_prefix(column: Any, ref: str, kind: str) -> Any:
    """Ids starting with `ref`, or with `ref` after the kind prefix (`task_`, `dev_`), which
    users tend to leave out. LIKE wildcards in `ref` are taken literally."""
    own = f"{kind}_"
    if ref.startswith(own):
        return column.startswith(ref, autoescape=True)
    return or_(column.startswith(ref, autoescape=True), column.startswith(own + ref, autoescape=True))


def id_prefix(column: Any, ref: str, kind: str) -> Any:
    """Ids starting with `ref`, with or without their kind prefix (see `_id_prefix`)."""
    return _id_prefix(column, ref, kind)


def _table(model: type[Base]) -> Table:
    return cast(Table, model.__table__)


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or []


def encode_cursor(at: datetime, task_id: str) -> str:
    raw = json.dumps([at.isoformat(), task_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class BadCursor(ValueError):
    pass


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, tid = json.loads(raw)
        if "\x00" in str(tid):  # Postgres cannot compare it; no id contains one
            raise ValueError("NUL in a cursor")
        return datetime.fromisoformat(at), str(tid)
    except (ValueError, TypeError) as exc:
        raise BadCursor("the cursor is not one this server issued; start again without it") from exc


def _json_object(text: str | None) -> dict[str, Any]:
    value = orjson.loads(text) if text is not None else None
    return value if isinstance(value, dict) else {}
