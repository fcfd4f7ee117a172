"""A replica that does not lead the engine still answers its devices truthfully (issue 15).

Its engine never started, so the heartbeat answer cannot come from there: it comes from the
device's session on this replica's gateway (the batch it relayed and has no results for). The
device here is a raw protocol client over a real WebSocket to the follower of two real replicas
on Postgres and Redis; its own heartbeats always say `idle` (it runs nothing: it answers each
batch at once), so the server's answer cannot be an echo of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect

from protocol.messages import (
    BatchAccepted,
    CommandBatch,
    DeviceInfo,
    Heartbeat,
    Hello,
    Message,
    Result,
    ResultBatch,
    Welcome,
)
from protocol.session import Channel, Role, Session
from tests.cluster.replicaset import ReplicaSet
from tests.simdevice import tool

WAIT_S = 30.0


class RawDevice:
    """One protocol session on a real socket: heartbeats every `beat_s`, frames and heartbeat
    answers collected in arrival order (the socket keeps the server's order)."""

    def __init__(self, ws: ClientConnection, channel: Channel, beat_s: float) -> None:
        self.ws = ws
        self.channel = channel
        self.beat_s = beat_s
        self.frames: asyncio.Queue[Message] = asyncio.Queue()
        self.answers: list[Heartbeat] = []
        self.answered = asyncio.Event()

    async def read(self) -> None:
        async for data in self.ws:
            msg = self.channel.receive(data)
            if isinstance(msg, Heartbeat):
                self.answers.append(msg)
                self.answered.set()
            elif msg is not None:
                await self.frames.put(msg)

    async def beat(self) -> None:
        while True:
            await self.ws.send(self.channel.send(Heartbeat(state="idle")))
            await asyncio.sleep(self.beat_s)

    async def next_answers(self, count: int) -> list[Heartbeat]:
        """The next `count` heartbeat answers from now (bounded wait)."""
        start = len(self.answers)
        async with asyncio.timeout(WAIT_S):
            while len(self.answers) < start + count:
                self.answered.clear()
                await self.answered.wait()
        return self.answers[start : start + count]

    async def send(self, message: Message) -> None:
        await self.ws.send(self.channel.send(message))


async def test_a_follower_answers_heartbeats_with_the_batch_it_relayed_and_idle_once_answered(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    rs = ReplicaSet(tmp_path, postgres_db, redis_db)
    await asyncio.to_thread(rs.__enter__)
    try:
        leader = await asyncio.to_thread(rs.leader)
        follower = next(r for r in rs.replicas if r is not leader)
        assert not await asyncio.to_thread(follower.is_leader)
        enrolled = await asyncio.to_thread(rs.enroll, "raw", {"where": "follower"})
        url = follower.url.replace("http://", "ws://") + "/v1/agent"
        async with connect(url, additional_headers={"Authorization": f"Bearer {enrolled['token']}"}) as ws:
            channel = Channel(Role.AGENT)
            hello = Hello(
                device_id=enrolled["id"], versions=[1], tools=[tool("sim.act")], info=DeviceInfo(platform="linux")
            )
            await ws.send(channel.send(hello))
            async with asyncio.timeout(WAIT_S):
                welcome = channel.receive(await ws.recv())
            assert isinstance(welcome, Welcome), welcome
            session = Session(welcome.session_id, welcome.version)
            channel.open_agent(welcome, session)
            device = RawDevice(ws, channel, welcome.heartbeat_interval_s / 2)
            tasks = [asyncio.create_task(device.read()), asyncio.create_task(device.beat())]
            try:
                assert [a.state for a in await device.next_answers(1)] == ["idle"]
                await asyncio.to_thread(rs.wait_device, enrolled["id"], "idle")

                node = {"id": "act", "placement": {"labels": {"where": "follower"}}, "commands": [{"tool": "sim.act"}]}
                with leader.client() as c:  # submitted to the leader: the batch crosses Redis
                    task = c.post("/v1/tasks", json={"dag": {"nodes": [node]}}).json()
                async with asyncio.timeout(WAIT_S):
                    batch = await device.frames.get()
                assert isinstance(batch, CommandBatch), batch
                session.confirm(batch.seq)
                await device.send(BatchAccepted(batch_id=batch.batch_id))

                # Every answer after the batch arrived names it, though the device says idle.
                busy = await device.next_answers(2)
                assert all((a.state, a.batch_id) == ("busy", batch.batch_id) for a in busy), busy

                results = [Result(call_id=c.call_id, status="success", result="done") for c in batch.commands]
                await device.send(ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=results))
                done = await asyncio.to_thread(rs.wait_task, task["id"])
                assert done["state"] == "succeeded", done
                after = await device.next_answers(2)
                assert all((a.state, a.batch_id) == ("idle", None) for a in after), after
                assert session.peer_ack == session.sent_seq  # the follower acknowledged the results
            finally:
                for t in tasks:
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t
    finally:
        await asyncio.to_thread(rs.__exit__, None, None, None)
