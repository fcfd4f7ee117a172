"""The gateway's side of delivery: what `send` promises, and what each replica reports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orchestrator.cluster import LocalCluster
from orchestrator.domain.model import Liveness
from orchestrator.gateway.hub import Gateway, Link
from orchestrator.security import Hasher
from protocol.messages import Command, CommandBatch
from protocol.session import Session
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
