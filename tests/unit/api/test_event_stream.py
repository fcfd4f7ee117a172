"""The event stream reads the store; the bus only wakes it (SPEC section 7: Redis is a hint)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.api import tasks
from orchestrator.api.tasks import SSE_POLL_S, _stream
from orchestrator.bus.local import LocalBus
from orchestrator.engine.times import utc
from orchestrator.store.models import ApiKey, Task
from orchestrator.store.repo import ChangeSet, Store
from tests.unit.engine.harness import Harness, one_node


async def _event(store: Store, task_id: str, state: str, at: float) -> None:
    changes = ChangeSet()
    changes.event({"task_id": task_id, "type": "task.state", "node_id": None, "data": {"state": state}, "at": utc(at)})
    await store.write(changes)


async def test_a_reader_whose_wake_up_never_comes_finds_the_events_in_the_store(tmp_path: Path) -> None:
    """Issue 12: an SSE or `--watch` reader waited for ever when a Redis message was lost."""
    h = await (await asyncio.to_thread(Harness, tmp_path)).open()
    try:
        task = await h.submit(one_node(), notify=False)
        bus = LocalBus()  # nothing is ever published on it: every wake-up is "lost"
        stream = _stream(SimpleNamespace(store=h.store, bus=bus), task, 0)
        await _event(h.store, task, "running", h.clock.now)
        async with asyncio.timeout(SSE_POLL_S * 3):
            first = await anext(stream)  # the reader is now past its first read of the store
            assert '"state":"running"' in first
            await _event(h.store, task, "succeeded", h.clock.now)
            second = await anext(stream)
        assert '"state":"succeeded"' in second
    finally:
        await h.close()


async def test_an_event_holding_an_int_over_64_bits_is_sent_as_stored(tmp_path: Path) -> None:
    """The store keeps such an int (it reads JSON with the standard library); the stream must
    write it out again, where orjson alone raised and ended the stream."""
    h = await (await asyncio.to_thread(Harness, tmp_path)).open()
    try:
        task = await h.submit(one_node(), notify=False)
        changes = ChangeSet()
        data = {"state": "running", "n": 2**70}
        changes.event({"task_id": task, "type": "node.state", "node_id": "n", "data": data, "at": utc(h.clock.now)})
        await h.store.write(changes)
        stream = _stream(SimpleNamespace(store=h.store, bus=LocalBus()), task, 0)
        async with asyncio.timeout(SSE_POLL_S * 3):
            frame = await anext(stream)
        assert f"{2**70}" in frame and '"state"' in frame
    finally:
        await h.close()


async def test_a_wake_up_makes_the_reader_look_at_once(tmp_path: Path) -> None:
    h = await (await asyncio.to_thread(Harness, tmp_path)).open()
    try:
        task = await h.submit(one_node(), notify=False)
        bus = LocalBus()
        stream = _stream(SimpleNamespace(store=h.store, bus=bus), task, 0)
        await _event(h.store, task, "running", h.clock.now)
        await anext(stream)
        await _event(h.store, task, "succeeded", h.clock.now)
        bus.publish([{"task_id": task}])
        async with asyncio.timeout(SSE_POLL_S / 2):  # well before a poll would find it
            assert '"state":"succeeded"' in await anext(stream)
    finally:
        await h.close()


async def test_a_reader_past_the_end_of_a_task_stops_once_the_task_has_ended(tmp_path: Path) -> None:
    """Issue 14: a cursor past the last event waited for ever, even when nothing more could come."""
    h = await (await asyncio.to_thread(Harness, tmp_path)).open()
    try:
        task = await h.submit(one_node(), notify=False)
        stream = _stream(SimpleNamespace(store=h.store, bus=LocalBus()), task, 10**12)
        pending = asyncio.ensure_future(anext(stream))
        done, _ = await asyncio.wait({pending}, timeout=SSE_POLL_S * 1.5)
        assert not done  # the task is still going: waiting is right
        await h.store.update(Task, (task,), state="succeeded")
        async with asyncio.timeout(SSE_POLL_S * 3):
            with pytest.raises(StopAsyncIteration):
                await pending
    finally:
        await h.close()


async def test_a_reader_whose_key_is_revoked_gets_an_error_event_and_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "KEY_CHECK_S", 0.0)
    h = await (await asyncio.to_thread(Harness, tmp_path)).open()
    try:
        task = await h.submit(one_node(), notify=False)
        row = {"id": "key_x", "name": "", "role": "viewer", "key_hash": "h", "created_at": utc(0), "revoked_at": None}
        await h.store.add(ApiKey, row)
        stream = _stream(SimpleNamespace(store=h.store, bus=LocalBus()), task, 0, "key_x")
        await _event(h.store, task, "running", h.clock.now)
        async with asyncio.timeout(SSE_POLL_S * 3):
            assert '"state":"running"' in await anext(stream)  # the key is good: events flow
            assert await h.store.revoke_api_key("key_x", utc(1))
            last = await anext(stream)
            assert last.startswith("event: error\n") and '"code":"key_revoked"' in last and "id:" not in last
            with pytest.raises(StopAsyncIteration):
                await anext(stream)
    finally:
        await h.close()


async def test_stored_event_text_goes_out_as_the_data_encoded_again_would(tmp_path: Path) -> None:
    """The stream writes the JSON text the store holds instead of parsing and encoding it again:
    the same bytes for every kind of value (non-ASCII, escapes, a newline in a string, an int
    over 64 bits, floats, nesting), and still one `data:` line per event."""
    from orchestrator.store.jsontext import json_text

    h = await (await asyncio.to_thread(Harness, tmp_path)).open()
    try:
        task = await h.submit(one_node(), notify=False)
        values = [
            {"state": "running", "text": 'é 漢字 "q" \\ \n line', "n": 2**70, "f": 0.1, "e": 1e300},
            {"state": "running", "nested": {"list": [1, None, True, {"k": "v"}]}, "empty": {}},
        ]
        changes = ChangeSet()
        for data in values:
            changes.event({"task_id": task, "type": "node.state", "node_id": "n", "data": data, "at": utc(h.clock.now)})
        await h.store.write(changes)
        events = await h.store.events_after(task, 0)
        assert [ev.text for ev in events] == [json_text(ev.data) for ev in events]
        assert [ev.data for ev in events] == values
        stream = _stream(SimpleNamespace(store=h.store, bus=LocalBus()), task, 0)
        async with asyncio.timeout(SSE_POLL_S * 3):
            chunk = await anext(stream)
        data_lines = [line for line in chunk.split("\n") if line.startswith("data: ")]
        assert data_lines == [f"data: {json_text(v)}" for v in values]
    finally:
        await h.close()
