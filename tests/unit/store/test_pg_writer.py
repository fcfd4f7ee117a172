"""The group commit on Postgres: the rows SQLAlchemy would write, in one round trip (four when a
row is inserted and touched again in one commit), one transaction whatever fails (a throwaway
server from the local binaries)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from orchestrator.engine.writer import refused_data
from orchestrator.store.migrate import upgrade
from orchestrator.store.models import Attempt, Device, Edge, Lease, Node, Task
from orchestrator.store.repo import ChangeSet, LeaseLost, Store, WriteConflict
from tests.services import asyncpg_dsn, fresh_database
from tests.unit.store.reference_commit import reference_write
from tests.unit.store.test_store import _a_busy_change_set, task_row

AT = datetime(2026, 11, 29, 12, 30, 15, 123456, tzinfo=UTC)
LEASE = "engine"


class CountingProxy:
    """A loopback proxy to Postgres that counts what the client sends: one read of the client's
    bytes per request it waits on (a round trip), as a client waits for each answer."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sent = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
            try:
                while data := await src.read(1 << 20):
                    self.sent += count
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def store(postgres_db: str) -> AsyncIterator[Store]:
    await asyncio.to_thread(upgrade, postgres_db)
    store = Store(postgres_db)
    try:
        yield store
    finally:
        await store.close()


def a_step(n: int) -> ChangeSet:
    """What a chained node's step writes: the next node's attempt opened, the node before it
    finished, its attempt ended, the device's fence moved on, events."""
    changes = ChangeSet()
    changes.insert(
        Attempt,
        {
            "batch_id": f"s{n}",
            "parent_batch_id": None,
            "kind": "tool",
            "task_id": "t1",
            "node_id": f"n{n}",
            "n": 1,
            "device_id": "d1",
            "fence": n + 1,
            "commands": [{"call_id": "c1", "tool": "system.echo", "arguments": {"text": "x"}}],
            "status": "dispatched",
            "deadline": AT + timedelta(seconds=90),
            "started_at": AT,
        },
    )
    changes.update(Node, ("t1", f"n{n}"), state="running", attempts=1, ready_since=None, queued_on="d1")
    changes.update(Node, ("t1", f"n{n - 1}"), state="succeeded", output={"x": n}, error=None, finished_at=AT)
    before = "b1" if n == 1 else f"s{n - 1}"  # the busy commit's attempt, then the steps'
    changes.update(Attempt, (before,), status="succeeded", results=[{"call_id": "c1"}], ended_at=AT)
    changes.update(Device, ("d1",), fence=n + 1, current_batch_id=f"s{n}")
    for state in ("succeeded", "running"):
        changes.event({"task_id": "t1", "type": "node.state", "node_id": f"n{n}", "data": {"s": state}, "at": AT})
    return changes


def a_quick_attempt(batch_id: str = "q1") -> ChangeSet:
    """An attempt opened and ended in one commit (its row inserted, then updated), nothing deleted."""
    changes = ChangeSet()
    row = a_step(9).inserts[Attempt][0] | {"batch_id": batch_id, "node_id": "n9"}
    changes.insert(Attempt, row)
    changes.update(Attempt, (batch_id,), status="failed", error={"code": "refused"}, ended_at=AT)
    changes.update(Node, ("t1", "n9"), state="failed", attempts=1)
    return changes


def first_steps() -> list[ChangeSet]:
    """The busy commit (rows of every shape, a row inserted and updated in one commit, a delete),
    steps of a chain on it (nothing inserted is touched again in its own commit), and an attempt
    inserted and updated in one commit."""
    return [_a_busy_change_set(), *(a_step(n) for n in range(1, 4)), a_quick_attempt()]


async def _rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows by primary key, JSON as its value (the texts differ in spacing only);
    not the server's id, which each database makes its own."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        tables = await conn.fetch(
            "SELECT c.relname AS name, array_agg(a.attname ORDER BY k.i) AS pk FROM pg_index x"
            " JOIN pg_class c ON c.oid = x.indrelid JOIN pg_namespace s ON s.oid = c.relnamespace"
            " CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, i)"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum"
            " WHERE x.indisprimary AND s.nspname = 'public' AND c.relname <> 'server_meta' GROUP BY c.relname"
        )
        out = {}
        for table in tables:
            order = ", ".join(f'"{c}"' for c in table["pk"])
            rows = await conn.fetch(f'SELECT * FROM "{table["name"]}" ORDER BY {order}')
            out[table["name"]] = [tuple(_value(v) for v in row.values()) for row in rows]
        return out
    finally:
        await conn.close()


def _value(cell: object) -> object:
    if isinstance(cell, str) and (cell[:1] in ("{", "[") or cell == "null"):
        return json.loads(cell)
    return cell


async def test_the_postgres_group_commit_writes_the_rows_sqlalchemy_writes(postgres_url: str) -> None:
    """On two fresh databases, the same commits through the store and through plain SQLAlchemy
    Core: the same rows and values in every table (JSON nulls as the text `null`, as SQLAlchemy
    writes them), and the same event ids."""
    with fresh_database(postgres_url) as fast, fresh_database(postgres_url) as reference:
        for url in (fast, reference):
            await asyncio.to_thread(upgrade, url)
        store = Store(fast)
        try:
            ids = [await store.write(changes) for changes in first_steps()]
        finally:
            await store.close()
        engine = create_async_engine(reference)
        try:
            expected = []
            for changes in first_steps():
                async with engine.begin() as conn:
                    expected.append(await conn.run_sync(reference_write, changes))
        finally:
            await engine.dispose()
        assert ids == expected == [list(range(1, 8)), [8, 9], [10, 11], [12, 13], []]
        written, wanted = await _rows(fast), await _rows(reference)
        assert len(written["nodes"]) == 300 and len(written["attempts"]) == 5 and len(written["events"]) == 13
        assert written == wanted
        null_error = await _scalar(fast, "SELECT count(*) FROM nodes WHERE error::text = 'null'")
        assert null_error == 3  # n0-n2's `error=None`: JSON null, as SQLAlchemy writes it


async def _scalar(url: str, sql: str) -> Any:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def test_a_guarded_step_commits_in_one_round_trip(postgres_db: str) -> None:
    """One statement, sent on its own: it checks the lease, writes the rows and commits. A
    commit's cost on a Postgres a network hop away is its round trips (SQLAlchemy's pool made a
    dozen: its ping, one per statement). A commit that inserts a row and updates it again needs
    the insert first: `BEGIN`, two statements, `COMMIT`."""
    await asyncio.to_thread(upgrade, postgres_db)
    url = make_url(postgres_db)
    proxy = CountingProxy(int(url.port or 5432))
    await proxy.start()
    store = Store(url.set(port=proxy.port).render_as_string(hide_password=False))
    try:
        fence = await store.acquire_lease(LEASE, "replica-a", 30)
        assert fence is not None
        guard = (LEASE, "replica-a", fence)
        for changes in first_steps():  # the statements prepared once, as on any long-lived server
            changes.guard = guard
            await store.write(changes)
        sent = []
        for changes in [*(a_step(n) for n in range(4, 8)), a_quick_attempt("q2")]:
            changes.guard = guard
            before = proxy.sent
            await store.write(changes)
            sent.append(proxy.sent - before)
        assert sent == [1, 1, 1, 1, 4]
        bundle = await store.get_task("t1")
        assert bundle is not None
        assert {n.id: n.state for n in bundle.nodes if n.id in ("n6", "n7")} == {"n6": "succeeded", "n7": "running"}
        assert await _scalar(postgres_db, "SELECT status FROM attempts WHERE batch_id = 'q2'") == "failed"
    finally:
        await store.close()
        proxy.close()


async def test_a_guarded_commit_under_a_lost_lease_writes_nothing_and_the_writer_goes_on(
    store: Store, postgres_db: str
) -> None:
    fence = await store.acquire_lease(LEASE, "replica-a", 30)
    assert fence is not None
    changes = ChangeSet(guard=(LEASE, "replica-a", fence))
    changes.insert(Task, task_row("t1"))
    await store.write(changes)
    await store.release_lease(LEASE, "replica-a")
    assert await store.acquire_lease(LEASE, "replica-b", 30) == fence + 1
    stale = ChangeSet(guard=(LEASE, "replica-a", fence))
    stale.update(Task, ("t1",), state="failed")
    stale.event({"task_id": "t1", "type": "task.state", "node_id": None, "data": {}, "at": AT})
    with pytest.raises(LeaseLost):
        await store.write(stale)
    quick = a_quick_attempt()  # the other shape: BEGIN, the inserts (checking the lease), the rest
    quick.guard = (LEASE, "replica-a", fence)
    with pytest.raises(LeaseLost):
        await store.write(quick)
    current = ChangeSet(guard=(LEASE, "replica-b", fence + 1))  # the same connection, its transaction ended
    current.update(Task, ("t1",), state="succeeded")
    await store.write(current)
    task = await store.get_task("t1")
    assert task is not None and task.task.state == "succeeded"
    assert await store.events_after("t1", 0) == []
    assert await _scalar(postgres_db, "SELECT count(*) FROM attempts") == 0


async def test_a_lease_holder_with_a_quote_in_its_name_is_checked_as_written(store: Store, postgres_db: str) -> None:
    """The lease check's holder goes out as a parameter: a quote or a backslash in it is data,
    never SQL, also where the server reads backslashes in plain literals as escapes."""
    await _scalar(
        postgres_db,
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET standard_conforming_strings = off',"
        " current_database()); END $$",
    )
    holder = "replica-'a'\\'; DELETE FROM tasks; --"
    fence = await store.acquire_lease(LEASE, holder, 30)
    assert fence is not None
    changes = ChangeSet(guard=(LEASE, holder, fence))
    changes.insert(Task, task_row("t1"))
    await store.write(changes)
    other = ChangeSet(guard=(LEASE, "replica-'a'", fence))
    other.insert(Task, task_row("t2"))
    with pytest.raises(LeaseLost):
        await store.write(other)
    assert await store.get_task("t1") is not None and await store.get_task("t2") is None
    assert await store.lease_holder(LEASE) == holder


async def test_refused_data_rolls_back_the_whole_commit_as_the_engine_reads_it(store: Store) -> None:
    """A unique clash is a WriteConflict, a value too long is data the store refuses (never cut
    short to fit): either way nothing of the commit is written, and the engine sees the input's
    fault, not the store's."""
    first = ChangeSet()
    first.insert(Task, task_row("t1", key="k"))
    await store.write(first)
    clash = ChangeSet()
    clash.insert(Task, task_row("t2", key="k"))
    clash.update(Task, ("t1",), state="failed")
    clash.event({"task_id": "t2", "type": "task.state", "node_id": None, "data": {}, "at": AT})
    with pytest.raises(WriteConflict):
        await store.write(clash)
    too_long = ChangeSet()
    too_long.update(Task, ("t1",), state="x" * 500)
    too_long.insert(Edge, {"task_id": "t1", "source": "a", "target": "b", "on": "success"})
    with pytest.raises(DBAPIError) as refused:
        await store.write(too_long)
    assert refused_data(refused.value) and not refused.value.connection_invalidated
    bundle = await store.get_task("t1")
    assert bundle is not None and bundle.task.state == "running" and bundle.edges == []
    assert await store.get_task("t2") is None and await store.events_after("t2", 0) == []


async def test_a_writer_whose_connection_was_cut_reconnects_and_writes_once(store: Store, postgres_db: str) -> None:
    """The connection ended under the writer (a restarted Postgres, a cut network): the write
    fails as the store being away (the engine retries it) or succeeds on a new connection; the
    row is written once."""
    first = ChangeSet()
    first.insert(Task, task_row("t1"))
    await store.write(first)
    killed = await _scalar(
        postgres_db,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    assert killed >= 1
    second = ChangeSet()
    second.insert(Task, task_row("t2"))
    second.update(Lease, ("none",), fence=1)  # a key with no row: updates nothing
    try:
        await store.write(second)
    except DBAPIError as exc:
        assert exc.connection_invalidated and not refused_data(exc)
        await store.write(second)
    assert await _scalar(postgres_db, "SELECT count(*) FROM tasks") == 2


async def test_the_hot_reads_answer_in_one_round_trip_and_across_a_cut_connection(postgres_db: str) -> None:
    """An event stream's read after each commit, and every request's key check: one round trip
    each (a pooled session made six); a connection lost since is made again, unseen by the caller."""
    await asyncio.to_thread(upgrade, postgres_db)
    url = make_url(postgres_db)
    proxy = CountingProxy(int(url.port or 5432))
    await proxy.start()
    store = Store(url.set(port=proxy.port).render_as_string(hide_password=False))
    try:
        changes = ChangeSet()
        changes.insert(Task, task_row("t1"))
        for i in range(3):
            changes.event({"task_id": "t1", "type": "node.state", "node_id": f"n{i}", "data": {"i": [i]}, "at": AT})
        assert await store.write(changes) == [1, 2, 3]
        await store.events_after("t1", 0)  # the statements prepared once
        await store.task_state("t1")
        before = proxy.sent
        events = await store.events_after("t1", 1)
        assert [(e.id, e.type, e.node_id, e.data) for e in events] == [
            (2, "node.state", "n1", {"i": [1]}),
            (3, "node.state", "n2", {"i": [2]}),
        ]
        assert await store.task_state("t1") == "running"
        assert proxy.sent - before == 2
        await _scalar(
            postgres_db,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        assert [e.id for e in await store.events_after("t1", 0)] == [1, 2, 3]
        assert await store.task_state("gone") is None
        assert await store.find_api_key("no such hash") is None
    finally:
        await store.close()
        proxy.close()


async def test_a_slow_read_holds_up_no_event_stream(store: Store, postgres_db: str) -> None:
    """The hot reads have connections side by side: one read waiting (here on a lock another
    session holds) leaves the others answering."""
    changes = ChangeSet()
    changes.insert(Task, task_row("t1"))
    changes.event({"task_id": "t1", "type": "task.state", "node_id": None, "data": {}, "at": AT})
    await store.write(changes)
    holder = await asyncpg.connect(asyncpg_dsn(postgres_db))
    try:
        await holder.execute("SELECT pg_advisory_lock(7)")
        reader = store._reader
        assert reader is not None
        waiting = asyncio.create_task(reader.fetch("SELECT pg_advisory_lock(7)"))
        for _ in range(1000):  # until the waiting read holds its connection (bounded)
            if any(c.busy for c in reader._made):
                break
            await asyncio.sleep(0.01)
        answers = await asyncio.wait_for(
            asyncio.gather(*(store.events_after("t1", 0) for _ in range(6)), store.task_state("t1")), 30
        )
        assert [[e.id for e in a] for a in answers[:6]] == [[1]] * 6 and answers[6] == "running"
        assert not waiting.done()
        await holder.execute("SELECT pg_advisory_unlock(7)")
        await asyncio.wait_for(waiting, 30)
    finally:
        await holder.close()
