"""How the gateway takes a device's frames (orchestrator/gateway/websocket.py, `_Pump` in hub.py).

The real app under a real uvicorn server on loopback, in this test's event loop, so the engine's
door (`Cluster.submit`) can be held shut at a chosen frame: the frames that arrive meanwhile must
wait and then be taken in order, a disconnect among them included, and a heartbeat answered only
after the frame before it is durable. Both ways frames come in are tried: handed over by our
uvicorn protocol (`orrery.frames`), and through plain ASGI `receive()` (any other server).

And the reason for handing frames over: an idle device's connection must not rebuild waiting
coroutines and futures on every heartbeat (at 10,000 devices their churn set off full garbage
collections that paused the server for up to a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import threading
import time
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as connect_sync

from orchestrator.api.deps import Components
from orchestrator.app import create_app
from orchestrator.config import Settings
from orchestrator.engine.records import FrameIn
from orchestrator.gateway.hub import _Pump
from orchestrator.gateway.websocket import GatewayWebSocketProtocol, websocket_options
from tests.support import free_port

TOOL = {"name": "raw.echo", "namespace": "raw", "annotations": {"read_only": True}, "tool_type": "data_collection"}


class Served:
    def __init__(self, server: uvicorn.Server, app: Any, port: int, key: str) -> None:
        self.server, self.app, self.port, self.key = server, app, port, key

    @property
    def components(self) -> Components:
        comp: Components = self.app.state.components
        return comp

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/agent"

    async def enroll(self, name: str) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", headers=self._auth) as c:
            r = await c.post("/v1/devices", json={"name": name, "labels": {}})
            assert r.status_code == 201, r.text
            enrolled: dict[str, Any] = r.json()
            return enrolled

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def pumps(self) -> list[_Pump]:
        """The frame sinks attached on this server's connections."""
        return [
            c.inbox.sink
            for c in self.server.server_state.connections
            if isinstance(c, GatewayWebSocketProtocol) and isinstance(c.inbox.sink, _Pump)
        ]


@contextlib.asynccontextmanager
async def served(tmp_path: Path, frames_extension: bool = True, **settings: Any) -> AsyncIterator[Served]:
    settings = Settings(data_dir=tmp_path / "data", heartbeat_interval_s=30, **settings)
    settings.data_dir.mkdir()
    app = create_app(settings)
    port = free_port()
    options = websocket_options(settings)
    if not frames_extension:
        options["ws"] = "websockets-sansio"  # uvicorn's own protocol: frames through receive()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, timeout_graceful_shutdown=5, **options)
    )
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(60):
        while not server.started:
            assert not task.done(), "the server stopped while starting"
            await asyncio.sleep(0.02)
    key = (settings.data_dir / "admin.key").read_text().strip()
    try:
        yield Served(server, app, port, key)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.005)
    assert check(), what


def frame(type_: str, seq: int, ack: int = 0, **payload: Any) -> str:
    return json.dumps({"v": 1, "type": type_, "seq": seq, "ack": ack, **payload})


async def hello(ws: ClientConnection, device_id: str) -> None:
    await ws.send(frame("hello", 0, device_id=device_id, versions=[1], tools=[TOOL], info={"platform": "linux"}))
    assert json.loads(await ws.recv())["type"] == "welcome"


class EngineDoor:
    """`Cluster.submit`, held shut for the `tools_changed` frame with seq 1 until `open`."""

    def __init__(self, comp: Components) -> None:
        self.inner = comp.cluster.submit
        self.taken: list[int] = []
        self.opened = asyncio.Event()
        comp.cluster.submit = self.submit  # type: ignore[method-assign]

    def submit(self, item: Any) -> asyncio.Future[Any]:
        """A future, as `Cluster.submit` returns; only frame 1 of `tools_changed` waits for `open`."""
        if isinstance(item, FrameIn) and item.message.type == "tools_changed":
            self.taken.append(item.message.seq)
            if item.message.seq == 1:
                return asyncio.ensure_future(self._after_open(item))
        return self.inner(item)

    async def _after_open(self, item: Any) -> Any:
        await self.opened.wait()
        return await self.inner(item)


@pytest.mark.parametrize("frames_extension", [True, False], ids=["handed-over", "asgi-receive"])
async def test_frames_that_arrive_while_one_waits_for_the_engine_are_taken_after_it_in_order(
    tmp_path: Path, frames_extension: bool
) -> None:
    async with served(tmp_path, frames_extension) as srv:
        door = EngineDoor(srv.components)
        device = await srv.enroll("d1")
        async with connect(srv.ws_url, additional_headers={"Authorization": f"Bearer {device['token']}"}) as ws:
            await hello(ws, device["id"])
            # One burst: a durable frame, a heartbeat, another durable frame.
            await ws.send(frame("tools_changed", 1, tools=[TOOL]))
            await ws.send(frame("heartbeat", 0, state="idle"))
            await ws.send(frame("tools_changed", 2, tools=[TOOL]))
            await until(lambda: door.taken == [1], "the first frame reached the engine")
            if frames_extension:
                [pump] = srv.pumps()
                await until(lambda: len(pump.backlog or []) == 2, "both frames read")
                assert pump.busy is not None
            assert door.taken == [1], "the second frame went to the engine before the first was durable"
            door.opened.set()
            # The heartbeat was taken after frame 1 was durable, so its answer acknowledges it.
            async with asyncio.timeout(20):
                while True:
                    answer = json.loads(await ws.recv())
                    if answer["type"] == "heartbeat":
                        break
            assert answer["ack"] >= 1
            await until(lambda: door.taken == [1, 2], "the second frame reached the engine")
            link = srv.components.gateway.links[device["id"]]
            await until(lambda: link.session.confirmed_seq == 2, "both frames confirmed")
            if frames_extension:
                await until(lambda: pump.backlog is None and pump.busy is None, "the pump is idle again")
                assert not pump.ended.done()


async def test_a_disconnect_read_while_a_frame_waits_ends_the_connection_after_the_frames_before_it(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as srv:
        door = EngineDoor(srv.components)
        gateway = srv.components.gateway
        device = await srv.enroll("d1")
        ws = await connect(srv.ws_url, additional_headers={"Authorization": f"Bearer {device['token']}"})
        await hello(ws, device["id"])
        link = gateway.links[device["id"]]
        [pump] = srv.pumps()
        # Frame 1, frame 2 and the device's close in one TCP write, so the server reads all three
        # together while frame 1 waits for the engine (later bytes would wait unread).
        protocol = ws.protocol
        protocol.send_text(frame("tools_changed", 1, tools=[TOOL]).encode())
        protocol.send_text(frame("tools_changed", 2, tools=[TOOL]).encode())
        protocol.send_close(1000)
        assert ws.transport is not None
        ws.transport.write(b"".join(protocol.data_to_send()))
        await until(lambda: door.taken == [1], "frame 1 reached the engine")
        await until(lambda: len(pump.backlog or []) >= 2 and (pump.backlog or [""])[1] is None, "the close read")
        assert link.conn is not None and not pump.ended.done()
        ws.transport.abort()
        door.opened.set()
        await until(pump.ended.done, "the connection ended")
        assert door.taken == [1, 2], "the frame read before the disconnect was not taken"
        await until(lambda: link.conn is None, "the link let go of the connection")
        assert link.session.confirmed_seq == 2


async def test_a_malformed_frame_read_while_a_frame_waits_is_refused_after_it_with_4400(tmp_path: Path) -> None:
    """The frame before it still becomes durable and is confirmed; then the device gets the
    `malformed_frame` error and close 4400, and nothing after it is taken."""
    async with served(tmp_path) as srv:
        door = EngineDoor(srv.components)
        device = await srv.enroll("d1")
        async with connect(srv.ws_url, additional_headers={"Authorization": f"Bearer {device['token']}"}) as ws:
            await hello(ws, device["id"])
            link = srv.components.gateway.links[device["id"]]
            [pump] = srv.pumps()
            await ws.send(frame("tools_changed", 1, tools=[TOOL]))
            await ws.send('{"v": 1, "type": "tools_changed", "seq": 2')  # cut short
            await ws.send(frame("tools_changed", 3, tools=[TOOL]))
            await until(lambda: len(pump.backlog or []) == 2, "both later frames read")
            door.opened.set()
            frames = []
            with contextlib.suppress(ConnectionClosed):
                async with asyncio.timeout(20):
                    while True:
                        frames.append(json.loads(await ws.recv()))
            assert ws.close_code == 4400
            assert frames[-1]["type"] == "error" and frames[-1]["code"] == "malformed_frame", frames
            assert door.taken == [1], "a frame after the malformed one was taken"
            assert link.session.confirmed_seq == 1


def _waiting_objects() -> list[Any]:
    """Coroutines and futures alive now (the clients run in threads: these are the server's)."""
    return [o for o in gc.get_objects() if issubclass(type(o), types.CoroutineType | asyncio.Future)]


async def test_an_idle_connection_rebuilds_no_waiting_coroutines_or_futures_per_heartbeat(tmp_path: Path) -> None:
    devices = 40
    async with served(tmp_path) as srv:
        gateway = srv.components.gateway
        enrolled = [await srv.enroll(f"d{i}") for i in range(devices)]
        beats = [threading.Semaphore(0) for _ in enrolled]
        stop = threading.Event()

        def device(enrolled: dict[str, Any], beat: threading.Semaphore) -> None:
            with connect_sync(srv.ws_url, additional_headers={"Authorization": f"Bearer {enrolled['token']}"}) as ws:
                ws.send(frame("hello", 0, device_id=enrolled["id"], versions=[1], tools=[TOOL], info={}))
                assert json.loads(ws.recv(timeout=30))["type"] == "welcome"
                while beat.acquire(timeout=60) and not stop.is_set():
                    ws.send(frame("heartbeat", 0, state="idle"))

        threads = [
            threading.Thread(target=device, args=args, daemon=True) for args in zip(enrolled, beats, strict=True)
        ]
        for t in threads:
            t.start()
        await until(lambda: len(gateway.links) == devices, "all devices connected")

        async def heartbeat_round() -> None:
            """Every device sends a heartbeat; until the server has read them all and written
            its answers."""
            mark = time.monotonic()
            for beat in beats:
                beat.release()
            await until(lambda: all(link.last_frame > mark for link in gateway.links.values()), "heartbeats read")
            await until(
                lambda: all(getattr(link.conn, "writer", None) is None for link in gateway.links.values()), "written"
            )

        await heartbeat_round()  # warm up: every lazy path taken once
        before = _waiting_objects()  # held, so no new object can reuse one of their ids
        known = {id(o) for o in before}
        await heartbeat_round()
        await heartbeat_round()
        new = [o for o in _waiting_objects() if id(o) not in known and not (isinstance(o, asyncio.Future) and o.done())]
        # The server's own timers (liveness, link reports, uvicorn's tick) make a few; the old
        # gateway's reader and writer made 7 per device and heartbeat (the receive() chain and the
        # writer's queue wait): here 2 x 7 x 40.
        assert len(new) < devices // 2, [getattr(o, "__qualname__", type(o).__name__) for o in new][:40]
        stop.set()
        for beat in beats:
            beat.release()
        for t in threads:
            await asyncio.to_thread(t.join, 30)
        del before
