"""The store's group commit writes rows that read back exactly as SQLAlchemy would have written them."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.store.migrate import upgrade
from orchestrator.store.models import Edge, Node, Task
from orchestrator.store.repo import ChangeSet, Store, WriteConflict
from tests.support import wait_until

AT = datetime(2026, 11, 29, 12, 30, 15, 123456, tzinfo=UTC)


@pytest.fixture
async def store(tmp_path: Path) -> Store:
    url = f"sqlite+aiosqlite:///{tmp_path / 'o.db'}"
    await asyncio.to_thread(upgrade, url)
    return Store(url)


def task_row(task_id: str, key: str | None = None) -> dict[str, object]:
    return {
        "id": task_id,
        "name": "n",
        "state": "running",
        "priority": 0,
        "labels": {"a": "b"},
        "idempotency_key": key,
        "created_at": AT,
    }


async def test_a_change_set_round_trips_json_datetimes_defaults_and_keyword_columns(store: Store) -> None:
    changes = ChangeSet()
    changes.insert(Task, task_row("t1"))
    changes.insert(
        Node, {"task_id": "t1", "id": "a", "position": 0, "kind": "tool", "spec": {"x": [1, 2]}, "state": "pending"}
    )
    changes.insert(Edge, {"task_id": "t1", "source": "a", "target": "a", "on": "always"})
    changes.event({"task_id": "t1", "type": "task.state", "node_id": None, "data": {"s": 1}, "at": AT})
    changes.event({"task_id": "t1", "type": "node.state", "node_id": "a", "data": {"s": 2}, "at": AT})
    ids = await store.write(changes)
    assert ids == [1, 2]
    update = ChangeSet()
    update.update(Node, ("t1", "a"), state="succeeded", output={"stdout": "hi"}, finished_at=AT)
    update.event({"task_id": "t1", "type": "x", "node_id": None, "data": {}, "at": AT})
    assert await store.write(update) == [3]
    bundle = await store.get_task("t1")
    assert bundle is not None
    assert bundle.task.labels == {"a": "b"} and bundle.task.created_at == AT
    assert bundle.task.cancel_requested is False and bundle.task.dag_version == 1  # column defaults
    node = bundle.nodes[0]
    assert (node.state, node.output, node.spec, node.finished_at) == ("succeeded", {"stdout": "hi"}, {"x": [1, 2]}, AT)
    assert bundle.edges[0].on == "always"
    assert [e.id for e in await store.events_after("t1", 1)] == [2, 3]
    await store.close()


async def test_a_unique_clash_is_a_write_conflict_and_writes_nothing(store: Store) -> None:
    first = ChangeSet()
    first.insert(Task, task_row("t1", key="k"))
    await store.write(first)
    clash = ChangeSet()
    clash.insert(Task, task_row("t2", key="k"))
    clash.event({"task_id": "t2", "type": "task.state", "node_id": None, "data": {}, "at": AT})
    with pytest.raises(WriteConflict):
        await store.write(clash)
    assert await store.get_task("t2") is None
    assert await store.events_after("t2", 0) == []
    await store.close()


def test_the_fast_converters_write_exactly_what_sqlalchemy_would() -> None:
    from datetime import timedelta, timezone

    from sqlalchemy.dialects import sqlite

    from orchestrator.store.jsontext import json_text
    from orchestrator.store.models import Event
    from orchestrator.store.sqlite_writer import sqlite_datetime

    dialect = sqlite.dialect()
    slow_dt = Event.__table__.c.at.type._cached_bind_processor(dialect)
    for value in (AT, datetime(2026, 1, 2, 3, 4, 5, 60, tzinfo=timezone(timedelta(hours=-7)))):
        assert sqlite_datetime(value) == slow_dt(value)
    value = {"a": [1, 2.5, None, True], "b": {"c": "é"}}
    import json

    assert json.loads(json_text(value)) == value


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, 2.5, null, true, -0.0, 1e-7, 0.30000000000000004], "b": {"c": "\\u00e9\\n"}}',
        "[18446744073709551615, 18446744073709551616, -9223372036854775809, 99999999999999999999999]",
        '{"id": "1234567890123456789012"}',  # a long digit run in a string only: read the slow way, same value
        "[NaN, Infinity, -Infinity]",  # the standard library's extension, which orjson refuses
        '"\\ud800"',  # a lone surrogate, likewise
        '{"k": 1, "k": 2}',
    ],
)
def test_json_columns_read_back_as_the_standard_library_reads_them(text: str) -> None:
    """`json_value` takes orjson's speed only where it reads what `json.loads` reads: an int over
    64 bits stays an int (orjson would make it a float), NaN and lone surrogates still load."""
    import json

    from orchestrator.store.jsontext import json_value

    expected = repr(json.loads(text))  # repr: an int and a float of one value differ, NaN equals NaN
    assert repr(json_value(text)) == expected
    assert repr(json_value(text.encode())) == expected


async def test_soft_changes_absorbing_later_ones_keep_their_deletes_updates_and_events(store: Store) -> None:
    """Issue 12, defect 5: the engine merges pending soft updates with a step's changes; a DAG
    edit's deletes (a node, an edge) and an edge whose `on` changed must all reach the store."""
    setup = ChangeSet()
    setup.insert(Task, task_row("t1"))
    for node_id in ("a", "b", "c"):
        setup.insert(
            Node, {"task_id": "t1", "id": node_id, "position": 0, "kind": "tool", "spec": {}, "state": "pending"}
        )
    setup.insert(Edge, {"task_id": "t1", "source": "a", "target": "b", "on": "success"})
    setup.insert(Edge, {"task_id": "t1", "source": "a", "target": "c", "on": "success"})
    await store.write(setup)
    soft = ChangeSet()
    soft.update(Node, ("t1", "a"), state="running", attempts=1)
    soft.update(Node, ("t1", "c"), attempts=7)  # a pending soft update on a row deleted later
    later = ChangeSet()
    later.update(Node, ("t1", "a"), state="succeeded")
    later.delete(Node, ("t1", "c"))
    later.delete(Edge, ("t1", "a", "c"))
    later.update(Edge, ("t1", "a", "b"), on="always")
    later.event({"task_id": "t1", "type": "dag.edited", "node_id": None, "data": {}, "at": AT})
    soft.absorb(later)
    assert await store.write(soft) == [1]
    bundle = await store.get_task("t1")
    assert bundle is not None
    assert {n.id: (n.state, n.attempts) for n in bundle.nodes} == {"a": ("succeeded", 1), "b": ("pending", 0)}
    assert [(e.source, e.target, e.on) for e in bundle.edges] == [("a", "b", "always")]
    await store.close()


async def _epochs(store: Store) -> None:
    from orchestrator.store.models import Device

    try:
        await store.add(Device, {"id": "d1", "name": "d1", "token_hash": "h", "created_at": AT})
        assert [await store.open_session("d1") for _ in range(3)] == [1, 2, 3]
        assert await store.open_session("gone") == 0
        assert (await store.server_id()).startswith("srv_")
    finally:
        await store.close()


async def test_each_connection_of_a_device_gets_a_higher_epoch_from_the_store(store: Store) -> None:
    await _epochs(store)


async def test_each_connection_of_a_device_gets_a_higher_epoch_from_postgres(postgres_db: str) -> None:
    await asyncio.to_thread(upgrade, postgres_db)
    await _epochs(Store(postgres_db))


async def test_checkpoints_run_off_the_writer_and_stop_with_it(tmp_path: Path) -> None:
    """The writer's own connection never checkpoints (a checkpoint's fsyncs would stall the
    engine's loop); a thread of the store's copies committed pages into the database file."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'o.db'}"
    await asyncio.to_thread(upgrade, url)
    before = set(threading.enumerate())
    store = Store(url)
    (checkpointer,) = [t for t in threading.enumerate() if t not in before and t.name == "orrery-sqlite-checkpoint"]
    changes = ChangeSet()
    changes.insert(Task, task_row("t1"))
    await store.write(changes)

    def in_database_file() -> bool:  # immutable=1 reads the database file alone, not the WAL
        with contextlib.closing(sqlite3.connect(f"file:{tmp_path / 'o.db'}?immutable=1", uri=True)) as db:
            return db.execute("SELECT count(*) FROM tasks WHERE id = 't1'").fetchone()[0] == 1

    # The checkpointer is a thread of its own: waiting for it off the loop holds nothing up.
    await asyncio.to_thread(wait_until, in_database_file, 30, "the committed row to reach the database file")
    await store.close()
    assert not checkpointer.is_alive()


def _a_busy_change_set() -> ChangeSet:
    """Rows of every shape the engine writes in a step, and more rows of one table than fit in one
    multi-row insert: nodes with and without columns that have defaults, events, keyed updates of
    different column sets, a delete."""
    from datetime import timedelta

    from orchestrator.store.models import Attempt, Device

    changes = ChangeSet()
    changes.insert(Device, {"id": "d1", "name": "d1", "token_hash": "h", "created_at": AT, "labels": {"a": "b"}})
    changes.insert(Task, task_row("t1"))
    for i in range(300):  # 300 x 7 parameters: over SQLite's 999 in one statement
        node = {"task_id": "t1", "id": f"n{i}", "position": i, "kind": "tool", "spec": {"i": [i, None, 1.5]}}
        changes.insert(Node, node | ({"state": "pending", "attempts": 0} if i % 3 else {"state": "ready"}))
    for i in range(299):
        changes.insert(Edge, {"task_id": "t1", "source": f"n{i}", "target": f"n{i + 1}", "on": "success"})
    changes.insert(
        Attempt,
        {
            "batch_id": "b1",
            "parent_batch_id": None,
            "kind": "tool",
            "task_id": "t1",
            "node_id": "n0",
            "n": 1,
            "device_id": "d1",
            "fence": 1,
            "commands": [{"call_id": "c1", "tool": "sim.act", "arguments": {"text": "é"}}],
            "status": "dispatched",
            "deadline": AT + timedelta(seconds=90),
            "started_at": AT,
        },
    )
    changes.update(Device, ("d1",), current_batch_id="b1", fence=1)
    changes.update(Node, ("t1", "n0"), state="running", attempts=1, ready_since=AT, started_at=AT)
    changes.update(Node, ("t1", "n1"), state="succeeded", output={"ok": True}, error=None, finished_at=AT)
    changes.update(Attempt, ("b1",), status="succeeded", results=[{"call_id": "c1"}], ended_at=AT)
    changes.delete(Edge, ("t1", "n5", "n6"))
    for i in range(7):
        changes.event({"task_id": "t1", "type": "node.state", "node_id": f"n{i}", "data": {"state": i}, "at": AT})
    return changes


def _table_rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table's rows in rowid order, JSON text as its value: SQLAlchemy's json.dumps spaces and
    escapes what orjson does not, and it writes a JSON column's None as the text `null` where the
    SQLite writer writes NULL; each reads back the same."""
    import json

    def value(cell: object) -> object:
        return json.loads(cell) if isinstance(cell, str) and (cell[:1] in ("{", "[") or cell == "null") else cell

    with contextlib.closing(sqlite3.connect(path)) as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {
            t: [tuple(map(value, row)) for row in db.execute(f'SELECT * FROM "{t}" ORDER BY rowid')] for t in tables
        }


async def test_the_sqlite_group_commit_writes_the_rows_sqlalchemy_writes(tmp_path: Path) -> None:
    """The SQLite writer (planned statements, multi-row inserts, its own converters) against the
    plain SQLAlchemy Core commit, on two copies of one database: the same rows and values in every
    table, and the same event ids."""
    from sqlalchemy import create_engine

    from tests.unit.store.reference_commit import reference_write

    fast, reference = tmp_path / "fast.db", tmp_path / "reference.db"
    await asyncio.to_thread(upgrade, f"sqlite+aiosqlite:///{fast}")
    reference.write_bytes(fast.read_bytes())
    store = Store(f"sqlite+aiosqlite:///{fast}")
    ids = await store.write(_a_busy_change_set())
    await store.close()
    engine = create_engine(f"sqlite:///{reference}")
    with engine.begin() as conn:
        assert reference_write(conn, _a_busy_change_set()) == ids == list(range(1, 8))
    engine.dispose()
    written, expected = _table_rows(fast), _table_rows(reference)
    assert len(written["nodes"]) == 300 and len(written["edges"]) == 298 and len(written["events"]) == 7
    assert written == expected
