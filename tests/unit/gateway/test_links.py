"""The gateway's side of delivery: what `send` promises, and what each replica reports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator.cluster import LocalCluster
from orchestrator.domain.model import Liveness
from orchestrator.gateway.hub import _STOP, Connection, Gateway, Link
from orchestrator.security import Hasher
from protocol.codec import encode
from protocol.messages import Command, CommandBatch, ResultBatch
from protocol.session import AckPolicy, Channel, Phase, Role, Session
from tests.unit.engine.harness import Harness


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    h = await (await asyncio.to_thread(Harness, tmp_path)).open()
    try:
        gateway = Gateway(h.settings, h.store, Hasher(b"k" * 32), h.engine.metrics)
        gateway.bind(LocalCluster(h.engine, gateway))
        yield gateway
    finally:
        await h.close()


def batch(batch_id: str = "b1") -> CommandBatch:
    return CommandBatch(
        batch_id=batch_id, task_id="t", node_id="n", attempt=1, fence=1, commands=[Command(call_id="c1", tool="x.y")]
    )


def test_a_batch_queued_while_the_socket_is_down_counts_as_sent(gateway: Gateway) -> None:
    """Issue 12, defect 6: the frame is stamped into the session and goes out when the device
    resumes, so it may reach the device: `send` must say so (else a lost device's batch would
    count as never started and a non-idempotent command could run twice)."""
    session = Session("s1")
    gateway.links["d"] = Link("d", session, conn=None, epoch=3)
    assert gateway.send("d", batch(), epoch=3) is True
    assert [m.batch_id for m in session.unacked()] == ["b1"]  # type: ignore[union-attr]


def test_a_frame_for_a_newer_connection_than_the_one_held_here_is_not_taken(gateway: Gateway) -> None:
    gateway.links["d"] = Link("d", Session("s1"), conn=None, epoch=3)
    assert gateway.send("d", batch(), epoch=4) is False
    assert gateway.send("nobody", batch(), epoch=0) is False


def test_the_link_report_names_each_link_with_its_epoch_and_the_batch_its_device_runs(gateway: Gateway) -> None:
    gateway.links["d"] = Link("d", Session("s1"), conn=None, epoch=7, batch_id="b9")
    gateway.links["waiting"] = Link("waiting", Session("s2"), conn=None, epoch=2, waiting=1)
    report = gateway.link_report()
    assert report.replica == "local"
    by_id = {s.device_id: s for s in report.links}
    assert (by_id["d"].epoch, by_id["d"].batch_id, by_id["d"].liveness) == (7, "b9", Liveness.ONLINE)
    assert by_id["waiting"].silent_s == 0.0  # its frames wait on the engine: silence is not its fault


async def test_links_are_reported_in_parts_spread_over_the_interval_and_a_dropped_link_is_left_out(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 10,000 devices one report of every link held the loop (and every heartbeat answer)
    for ~60 ms: the periodic report goes out in parts. A link dropped or replaced after the
    pass began is not reported from the stale copy (it would say a gone device is online)."""
    from orchestrator.engine.records import LinkReport
    from orchestrator.gateway import hub

    monkeypatch.setattr(hub, "LINK_REPORT_CHUNK", 2)
    gateway.settings = gateway.settings.model_copy(update={"heartbeat_interval_s": 0.2})  # a 0.1 s interval
    for i in range(5):
        gateway.links[f"d{i}"] = Link(f"d{i}", Session(f"s{i}"), conn=None, epoch=1)
    parts: asyncio.Queue[LinkReport] = asyncio.Queue()
    monkeypatch.setattr(gateway.cluster, "report", parts.put_nowait)
    reporter = asyncio.create_task(gateway._report_links())
    try:
        first = await asyncio.wait_for(parts.get(), 10)
        del gateway.links["d3"]  # dropped
        gateway.links["d4"] = Link("d4", Session("s9"), conn=None, epoch=9)  # replaced
        second, third = [await asyncio.wait_for(parts.get(), 10) for _ in range(2)]
        assert [[s.device_id for s in p.links] for p in (first, second, third)] == [["d0", "d1"], ["d2"], []]
        next_pass = [await asyncio.wait_for(parts.get(), 10) for _ in range(2)]
        reported = {s.device_id: s.epoch for p in next_pass for s in p.links}
        assert reported == {"d0": 1, "d1": 1, "d2": 1, "d4": 9}
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter


class HeldEngine:
    """A cluster whose engine keeps every input until the test answers it."""

    replica_id = "local"

    def __init__(self) -> None:
        self.inputs: list[tuple[Any, asyncio.Future[Any]]] = []

    def submit(self, item: Any) -> asyncio.Future[Any]:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.inputs.append((item, answer))
        return answer

    def device_seen(self, device_id: str, epoch: int) -> None:
        pass


def open_connection(gateway: Gateway, engine: HeldEngine) -> tuple[Link, Connection]:
    gateway.bind(cast(Any, engine))
    session = Session("s1")
    channel = Channel(Role.SERVER)
    channel.session, channel.phase = session, Phase.OPEN
    conn = Connection(cast(Any, None), channel)
    link = Link("d", session, conn=conn, epoch=1)
    gateway.links["d"] = link
    return link, conn


def result_frame(seq: int) -> str:
    return encode(ResultBatch(seq=seq, batch_id=f"b{seq}", fence=1, results=[]))


async def test_a_result_frame_reaches_the_engine_in_the_turn_it_arrives_and_is_acknowledged_once_durable(
    gateway: Gateway,
) -> None:
    engine = HeldEngine()
    link, conn = open_connection(gateway, engine)
    step = gateway.take_frame(conn, "d", result_frame(1))
    assert [type(item.message).__name__ for item, _ in engine.inputs] == ["ResultBatch"]  # no loop turn needed
    assert link.waiting == 1  # the reader waits on the engine: its silence is not the device's
    assert step is not None and not isinstance(step, type(_STOP))
    waited = asyncio.ensure_future(cast(Any, step))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waited.done() and link.session.confirmed_seq == 0  # not acknowledged before it is durable
    engine.inputs[0][1].set_result(None)
    async with asyncio.timeout(5):
        await waited
    assert link.session.confirmed_seq == 1 and link.waiting == 0


async def test_an_engine_wait_nobody_awaits_any_more_still_ends_for_liveness(gateway: Gateway) -> None:
    """The connection may end before its reader awaits the engine's answer: the link's wait count
    (which keeps liveness from counting the silence) is settled by the answer itself."""
    engine = HeldEngine()
    link, conn = open_connection(gateway, engine)
    step = gateway.take_frame(conn, "d", result_frame(1))
    cast(Any, step).close()  # dropped unawaited, as when its task is cancelled before it starts
    engine.inputs[0][1].set_exception(RuntimeError("engine gone"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert link.waiting == 0


async def test_a_standalone_ack_is_timed_on_the_loops_clock_and_its_timer_runs_once(gateway: Gateway) -> None:
    """uvloop reads its clock once per loop turn: an ack timed on `time.monotonic()` could find
    itself early when its timer ran and re-arm on every turn until the clocks agreed (ten timer
    calls per frame under load). On the loop's own clock the timer runs once, and sends the ack."""
    link, conn = open_connection(gateway, HeldEngine())
    written: list[str] = []
    written_at: list[float] = []
    loop = asyncio.get_running_loop()

    def direct(text: str) -> bool:
        written.append(text)
        written_at.append(loop.time())
        return True

    conn.direct = direct
    link.session.received_seq = 1
    link.session.confirm(1)
    link.acks = AckPolicy(link.session, delay_s=0.01)
    due = link.acks.confirmed(loop.time())
    assert due is not None
    runs = 0
    ack_if_due = gateway._ack_if_due

    def counted(*args: Any) -> None:
        nonlocal runs
        runs += 1
        ack_if_due(*args)

    gateway._ack_if_due = counted  # type: ignore[method-assign]
    gateway._ack_at(due, link, conn)
    async with asyncio.timeout(5):
        while not written:
            await asyncio.sleep(0.005)
    assert [json.loads(t)["ack"] for t in written] == [1] and runs == 1
    # Not before it was due: the loop runs a timer at most its clock's resolution early.
    assert written_at[0] >= due - max(loop._clock_resolution, 0.001)  # type: ignore[attr-defined]


def test_on_uvloop_an_ack_armed_at_the_end_of_a_long_turn_runs_its_timer_once(tmp_path: Path) -> None:
    """The case that spun: uvloop's clock read at the start of a turn that then ran 20 ms (a big
    engine step), an ack armed at its end. Timed on `time.monotonic()`, its timer ran early and
    re-armed turn after turn; on the loop's clock it runs once."""
    import uvloop

    async def scenario() -> tuple[int, list[int]]:
        h = await (await asyncio.to_thread(Harness, tmp_path)).open()
        try:
            gateway = Gateway(h.settings, h.store, Hasher(b"k" * 32), h.engine.metrics)
            link, conn = open_connection(gateway, HeldEngine())
            written: list[str] = []
            conn.direct = lambda text: written.append(text) is None
            link.session.received_seq = 1
            runs = 0
            ack_if_due = gateway._ack_if_due

            def counted(*args: Any) -> None:
                nonlocal runs
                runs += 1
                ack_if_due(*args)

            gateway._ack_if_due = counted  # type: ignore[method-assign]
            link.acks = AckPolicy(link.session, delay_s=0.01)

            def long_turn_then_confirm() -> None:
                time.sleep(0.02)  # a turn that keeps the loop busy: its clock is now 20 ms behind
                link.session.confirm(1)
                due = link.acks.confirmed(asyncio.get_running_loop().time())
                assert due is not None
                gateway._ack_at(due, link, conn)

            asyncio.get_running_loop().call_soon(long_turn_then_confirm)
            async with asyncio.timeout(5):
                while not written:
                    await asyncio.sleep(0.001)
            return runs, [json.loads(t)["ack"] for t in written]
        finally:
            await h.close()

    runs, acks = uvloop.run(scenario())
    assert acks == [1] and runs == 1
