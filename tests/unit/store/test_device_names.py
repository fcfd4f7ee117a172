"""The store: device names are unique among devices not revoked (the database enforces it),
ids resolve by prefix and name, device history stays bounded, and the reads the engine, event
streams and task views make (SQLite answers them without the ORM) agree with the ORM's. Both
backends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.api.render import task_detail
from orchestrator.store.migrate import upgrade
from orchestrator.store.models import Attempt, Device, DeviceHistory, Edge, Node, Task
from orchestrator.store.repo import ChangeSet, Store, TaskRows, WriteConflict

AT = datetime(2026, 12, 15, 9, 0, tzinfo=UTC)


def device(device_id: str, name: str, admin: str = "active") -> dict[str, object]:
    return {"id": device_id, "name": name, "token_hash": f"h-{device_id}", "admin_state": admin, "created_at": AT}


async def names_are_unique_among_devices_not_revoked(store: Store) -> None:
    await store.add(Device, device("dev_aaaa1111", "cam"))
    with pytest.raises(WriteConflict):
        await store.add(Device, device("dev_aaaa2222", "cam"))
    await store.update(Device, ("dev_aaaa1111",), admin_state="revoked")
    await store.add(Device, device("dev_aaaa2222", "cam"))  # the name is free again
    with pytest.raises(WriteConflict):
        await store.add(Device, device("dev_bbbb3333", "cam"))
    await store.update(Device, ("dev_aaaa2222",), admin_state="revoked")
    await store.add(Device, device("dev_bbbb3333", "cam"))  # two revoked devices share the name
    held = await store.find_device_by_name("cam")
    assert held is not None and held.id == "dev_bbbb3333"


async def ids_resolve_by_id_name_and_prefix(store: Store) -> None:
    for n, i in enumerate(("dev_cafe0001", "dev_cafe0002", "dev_d00d0003")):
        await store.add(Device, device(i, f"box{n}"))
    assert (await store.resolve_device("box1"))[0].id == "dev_cafe0002"  # type: ignore[union-attr]
    assert (await store.resolve_device("dev_d00d"))[0].id == "dev_d00d0003"  # type: ignore[union-attr]
    assert (await store.resolve_device("d00d"))[0].id == "dev_d00d0003"  # type: ignore[union-attr]
    row, candidates = await store.resolve_device("cafe")
    assert row is None and sorted(c.id for c in candidates) == ["dev_cafe0001", "dev_cafe0002"]
    assert await store.resolve_device("dev") == (None, [])  # too short to be a prefix
    assert await store.resolve_device("c%fe") == (None, [])  # LIKE wildcards are literal
    assert await store.resolve_device("dev_cafe_") == (None, [])
    changes = ChangeSet()
    for n, i in enumerate(("task_beef01", "task_beef02")):
        changes.insert(Task, {"id": i, "name": "nightly", "state": "succeeded", "created_at": AT + timedelta(n)})
    await store.write(changes)
    assert (await store.resolve_task("nightly"))[0].id == "task_beef02"  # type: ignore[union-attr]
    assert [t.id for t in (await store.resolve_task("beef"))[1]] == ["task_beef01", "task_beef02"]
    assert (await store.resolve_task("task_beef01"))[0].id == "task_beef01"  # type: ignore[union-attr]


async def history_is_pruned_to_the_newest(store: Store) -> None:
    changes = ChangeSet()
    for n in range(30):
        for dev in ("dev_p1", "dev_p2"):
            changes.insert(DeviceHistory, {"device_id": dev, "state": f"s{n}", "reason": "", "at": AT})
    await store.write(changes)
    assert await store.prune_device_history(["dev_p1"], 10) == 20
    rows, nxt = await store.device_history("dev_p1", 100, None)
    assert [r.state for r in rows] == [f"s{n}" for n in range(29, 19, -1)] and nxt is None
    first, cursor = await store.device_history("dev_p2", 20, None)  # untouched; pages by cursor
    assert cursor is not None
    rest, end = await store.device_history("dev_p2", 20, cursor)
    assert [r.state for r in first + rest] == [f"s{n}" for n in range(29, -1, -1)] and end is None


async def engine_and_stream_reads_agree(store: Store) -> None:
    changes = ChangeSet()
    for n, state in enumerate(("running", "planning", "succeeded", "running")):
        changes.insert(Task, {"id": f"task_{n}", "name": "t", "state": state, "created_at": AT + timedelta(seconds=n)})
    for n in range(3):
        type_ = "task.state" if n != 1 else "node.state"
        node = None if n != 1 else "a"
        data = {"n": n, "x": [1], "big": 2**70} if n == 1 else {"n": n, "x": [1]}  # an int over 64 bits stays one
        changes.event({"task_id": "task_0", "type": type_, "node_id": node, "data": data, "at": AT})
    changes.event({"task_id": "task_1", "type": "task.state", "node_id": None, "data": {}, "at": AT})
    ids = await store.write(changes)
    # Created at or after the bound, planning or running: the boundary itself is included.
    assert sorted(await store.active_task_ids(AT + timedelta(seconds=1))) == [
        ("task_1", "planning"),
        ("task_3", "running"),
    ]
    assert await store.task_state("task_2") == "succeeded" and await store.task_state("nope") is None
    events = await store.events_after("task_0", ids[0])
    assert repr([(e.id, e.type, e.node_id, e.data) for e in events]) == repr(
        [
            (ids[1], "node.state", "a", {"n": 1, "x": [1], "big": 2**70}),
            (ids[2], "task.state", None, {"n": 2, "x": [1]}),
        ]
    )
    assert [e.id for e in await store.events_after("task_0", 0, limit=2)] == ids[:2]
    assert await store.events_after("task_0", ids[2]) == []
    await store.add(Device, {**device("dev_cccc1111", "lab"), "labels": {"zone": "eu"}})
    assert await store.device_admin() == [("dev_cccc1111", "lab", "active", {"zone": "eu"}, "h-dev_cccc1111")]


async def a_task_view_reads_what_the_orm_reads(store: Store) -> None:
    """`task_view` (plain rows on SQLite) gives every column exactly as the ORM loads it, and the
    task renders the same from either: JSON of every shape (unicode, a huge int, null, nesting),
    datetimes with and without microseconds, booleans, defaults left to the database."""
    later = AT + timedelta(seconds=1, microseconds=250_001)
    changes = ChangeSet()
    changes.insert(
        Task,
        {"id": "task_v", "name": "vue", "state": "running", "created_at": AT, "replan": True, "labels": {"k": "é"}},
    )
    specs = [
        {"commands": [{"tool": "system.echo", "arguments": {"text": "ß ✓ \u0001"}}], "placement": {"os": "linux"}},
        {"commands": [], "retry": {"max_attempts": 3}, "priority": 5, "timeout_s": 1.5},
    ]
    for i, spec in enumerate(specs):
        changes.insert(
            Node, {"task_id": "task_v", "id": f"n{i}", "position": i, "kind": "tool", "spec": spec, "state": "pending"}
        )
    changes.update(
        Node,
        ("task_v", "n0"),
        state="succeeded",
        output={"big": 2**70, "none": None, "list": [1.5, "x"]},
        started_at=AT,
        finished_at=later,
    )
    changes.insert(Edge, {"task_id": "task_v", "source": "n0", "target": "n1"})
    for n, (status, ended) in enumerate((("failed", later), ("dispatched", None)), start=1):
        changes.insert(
            Attempt,
            {
                "batch_id": f"b{n}",
                "task_id": "task_v",
                "node_id": "n0",
                "n": n,
                "device_id": "dev_1",
                "fence": 2**40 + n,
                "commands": [{"call_id": "c1", "tool": "system.echo"}],
                "status": status,
                "started_at": AT,
                "ended_at": ended,
                "results": [{"call_id": "c1", "status": "failure", "result": {"deep": {"er": [None, True]}}}]
                if ended
                else None,
                "error": {"code": "tool_error", "message": "non"} if ended else None,
            },
        )
    await store.write(changes)
    view, orm = await store.task_view("task_v"), await store.get_task("task_v")
    assert orm is not None and view is not None and await store.task_view("nope") is None
    if isinstance(view, TaskRows):  # SQLite: each column as the ORM has it, type and all
        pairs = [(view.task, orm.task), *list(zip(view.nodes, orm.nodes, strict=True))]
        pairs += list(zip(view.attempts, orm.attempts, strict=True)) + list(zip(view.edges, orm.edges, strict=True))
        for row, obj in pairs:
            loaded = {c: getattr(obj, c) for c in row}
            assert repr(row) == repr(loaded)  # types too: 2**70 read as a float would compare equal
        assert len(pairs) == 1 + 2 + 2 + 1
    assert task_detail(view).model_dump(mode="json") == task_detail(orm).model_dump(mode="json")
    assert task_detail(view).nodes[0].attempts[0].results[0]["result"] == {"deep": {"er": [None, True]}}  # type: ignore[index]


CHECKS = [
    engine_and_stream_reads_agree,
    a_task_view_reads_what_the_orm_reads,
    names_are_unique_among_devices_not_revoked,
    ids_resolve_by_id_name_and_prefix,
    history_is_pruned_to_the_newest,
]


async def _run(url: str, check: Callable[[Store], Awaitable[None]]) -> None:
    await asyncio.to_thread(upgrade, url)
    store = Store(url)
    try:
        await check(store)
    finally:
        await store.close()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
async def test_on_sqlite(tmp_path: Path, check: Callable[[Store], Awaitable[None]]) -> None:
    await _run(f"sqlite+aiosqlite:///{tmp_path / 'o.db'}", check)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
async def test_on_postgres(postgres_db: str, check: Callable[[Store], Awaitable[None]]) -> None:
    await _run(postgres_db, check)
