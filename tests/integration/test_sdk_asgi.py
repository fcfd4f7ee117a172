"""`AsyncClient` drives an orchestrator app in-process, through `httpx2.ASGITransport`: the app's
lifespan is run by uvicorn in the same event loop (a simulated device connects to it over a real
WebSocket), and every API call of the client goes to the app object, not over the network."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from fastapi import FastAPI

from orchestrator.app import create_app
from orchestrator.config import Settings
from orchestrator.gateway.websocket import websocket_options
from orrery import AsyncClient, Dag, InvalidRequest, NotFound, Unauthorized, WaitTimeout, call
from tests.simdevice import DEFAULT_TOOLS, SimDevice, tool
from tests.support import free_port


@dataclass
class InProcess:
    app: FastAPI
    port: int
    key: str

    def client(self, key: str | None = None) -> AsyncClient:
        return AsyncClient("http://orrery.test", key or self.key, transport=httpx2.ASGITransport(app=self.app))


@contextlib.asynccontextmanager
async def in_process(tmp_path: Path) -> AsyncIterator[InProcess]:
    settings = Settings(data_dir=tmp_path / "data", heartbeat_interval_s=1)
    settings.data_dir.mkdir()
    app = create_app(settings)
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, timeout_graceful_shutdown=5, **websocket_options(settings)
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        await until(lambda: _started(server, serving), "the app to start")
        yield InProcess(app, port, (settings.data_dir / "admin.key").read_text().strip())
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


def _started(server: uvicorn.Server, serving: asyncio.Task[None]) -> bool:
    assert not serving.done(), "the server stopped while starting"
    return server.started


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while True:
            done = check()
            if done if isinstance(done, bool) else await done:
                return
            await asyncio.sleep(0.01)


async def test_the_async_client_runs_a_task_on_an_app_in_process(tmp_path: Path) -> None:
    async with in_process(tmp_path) as served, served.client() as client:
        enrolled = await client.enroll("sim-async", {"role": "web"})
        device = SimDevice(f"ws://127.0.0.1:{served.port}/v1/agent", enrolled.token, enrolled.id, {"role": "web"})
        running = asyncio.create_task(device.run())
        try:

            async def idle() -> bool:
                return (await client.device(enrolled.id)).state == "idle"

            await until(idle, "the device to be idle")
            dag = Dag("in-process")
            first = dag.node("first", call("sim.noop", {"echo": 7}), labels={"role": "web"})
            dag.node("second", call("sim.noop", {"echo": first.output.echo}), after=first)
            assert (await client.validate(dag)).valid
            task = await client.wait((await client.submit(dag)).id, timeout=30)
            assert task.state == "succeeded"
            assert task.node("second").output == {"tool": "sim.noop", "echo": 7}

            events = [e async for e in client.events(task.id)]
            assert events[-1].ends_task and [e.id for e in events] == sorted({e.id for e in events})
            assert [t.id async for t in client.tasks(page_size=1)] == [task.id]
            assert [d.name for d in await client.devices()] == ["sim-async"]
            assert "sim.noop" in {t.name for t in await client.device_tools("sim-async")}

            with pytest.raises(NotFound):
                await client.task("task_never")
            with pytest.raises(InvalidRequest) as refused:
                await client.submit({"nodes": [{"id": "a", "commands": [{"tool": "sim.nope"}]}]})
            assert refused.value.code == "unknown_tool"
            async with served.client("wrong") as stranger:
                with pytest.raises(Unauthorized):
                    await stranger.tasks_page()
        finally:
            await device.close()
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running


async def test_an_async_wait_is_bounded_even_though_an_asgi_answer_comes_whole(tmp_path: Path) -> None:
    """Over ASGI the event stream's answer arrives when the stream ends, so no read timeout can
    fire: `wait` bounds itself, and the task goes on (here until it is cancelled)."""
    async with in_process(tmp_path) as served, served.client() as client:
        enrolled = await client.enroll("sim-slow")
        opened = asyncio.Event()

        async def gate(arguments: dict[str, Any], attempt: int) -> Any:
            await opened.wait()
            return "opened"

        url = f"ws://127.0.0.1:{served.port}/v1/agent"
        tools = [*DEFAULT_TOOLS, tool("sim.gate", read_only=True)]
        device = SimDevice(url, enrolled.token, enrolled.id, tools=tools, handlers={"sim.gate": gate})
        running = asyncio.create_task(device.run())
        try:

            async def idle() -> bool:
                return (await client.device(enrolled.id)).state == "idle"

            await until(idle, "the device to be idle")
            dag = Dag("held")
            dag.node("held", call("sim.gate"))
            task = await client.submit(dag)
            with pytest.raises(WaitTimeout) as gave_up:
                await client.wait(task.id, timeout=0.3)
            assert gave_up.value.code == "wait_timeout"
            assert not (await client.task(task.id)).ended
            assert (await client.cancel(task.id)).state == "cancelling"
            opened.set()  # the device ends the command it was running when the cancel came
            assert (await client.wait(task.id, timeout=30)).state == "cancelled"
        finally:
            opened.set()
            await device.close()
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
