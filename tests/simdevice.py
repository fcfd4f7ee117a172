"""Simulated devices: real protocol clients over real WebSockets, many per process.

They speak the protocol through the same `protocol` package as the agent (sessions, acks,
resume) but run their "tools" in-process, so tests and benchmarks can drive dozens of devices
cheaply. Behaviour per tool is a Python callable; every execution is recorded with timestamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from device_agent.agent import ACCEPT_AFTER_S
from protocol.codec import encode
from protocol.messages import (
    BatchAccepted,
    Cancel,
    CommandBatch,
    ErrorInfo,
    Heartbeat,
    Hello,
    Result,
    ResultBatch,
    ToolAnnotations,
    ToolSpec,
    Welcome,
)
from protocol.session import Channel, Role, Session

# A tool handler gets (arguments, attempt number) and returns a result value, or raises ToolFailure.
Handler = Callable[[dict[str, Any], int], Awaitable[Any] | Any]


class ToolFailure(Exception):
    def __init__(self, code: str = "tool_error", message: str = "simulated failure") -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Execution:
    batch_id: str
    task_id: str
    node_id: str
    attempt: int
    started: float
    ended: float = 0.0


def tool(name: str, read_only: bool = False, idempotent: bool = False) -> ToolSpec:
    ns = name.split(".", 1)[0]
    return ToolSpec(
        name=name,
        namespace=ns,
        description=f"simulated {name}",
        input_schema={"type": "object"},
        annotations=ToolAnnotations(read_only=read_only, idempotent=idempotent, destructive=not read_only),
        tool_type="data_collection" if read_only else "action",
    )


DEFAULT_TOOLS = [tool("sim.noop", read_only=True), tool("sim.act"), tool("sim.sleep", read_only=True)]
FIXED_RETRY_S = 0.2  # without a reconnect policy, a simulated device retries at this fixed pace
STABLE_SESSION_S = 10.0  # as the real agent: a session this long ends an outage (policy.reset())


class ReconnectPolicy(Protocol):
    """When to dial again: the interface of `device_agent.reconnect.Backoff`."""

    def next_delay(self) -> float: ...

    def reset(self) -> None: ...


async def _default(name: str, arguments: dict[str, Any], attempt: int) -> Any:
    if name == "sim.sleep":
        await asyncio.sleep(float(arguments.get("seconds", 0.1)))
    if arguments.get("fail_attempts", 0) >= attempt:
        raise ToolFailure("tool_error", f"failing on purpose (attempt {attempt})")
    if arguments.get("fail"):
        raise ToolFailure("tool_error", "failing on purpose")
    return {"tool": name, "echo": arguments.get("echo")}


@dataclass
class SimDevice:
    url: str
    token: str
    device_id: str
    labels: dict[str, str] = field(default_factory=dict)
    tools: list[ToolSpec] = field(default_factory=lambda: list(DEFAULT_TOOLS))
    handlers: dict[str, Handler] = field(default_factory=dict)
    executions: list[Execution] = field(default_factory=list)
    welcomed: asyncio.Event = field(default_factory=asyncio.Event)
    heartbeat_s: float = 1.0
    session: Session | None = None
    _ws: ClientConnection | None = None
    _work: asyncio.Queue[CommandBatch] = field(default_factory=asyncio.Queue)
    _seen: dict[str, list[Result] | None] = field(default_factory=dict)
    _cancelled: set[str] = field(default_factory=set)
    _stop: bool = False
    # With a policy, reconnects pace themselves as the real agent's loop does (device_agent/agent.py):
    # after a failed or short-lived connection wait `next_delay()`; after a session that lasted
    # STABLE_SESSION_S, `reset()` and dial again at once. Without one: a fixed FIXED_RETRY_S.
    reconnect: ReconnectPolicy | None = None
    attempts: list[float] = field(default_factory=list)  # time.monotonic() of every dial
    welcomes: list[float] = field(default_factory=list)  # time.monotonic() of every welcome
    # As the real agent does (device_agent/agent.py, ACCEPT_AFTER_S): a batch that starts at once
    # is accepted by its results if they follow within ACCEPT_AFTER_S, else by a `batch_accepted`
    # sent then. Off by default, so the engine's handling of `batch_accepted` stays exercised.
    accept_by_results: bool = False
    _unaccepted: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    _sending: set[asyncio.Future[None]] = field(default_factory=set)

    async def run(self) -> None:
        worker = asyncio.create_task(self._worker())
        try:
            while not self._stop:
                opened = len(self.welcomes)
                try:
                    await self._connect_once()
                except Exception:  # like the real agent, never give up (refused, reset, mid-restart...)
                    if self._stop:
                        break
                    await asyncio.sleep(self._delay(opened))
                else:
                    if self.reconnect is not None:
                        await asyncio.sleep(self._delay(opened))
        finally:
            worker.cancel()

    def _delay(self, opened: int) -> float:
        if self.reconnect is None:
            return FIXED_RETRY_S
        stable = len(self.welcomes) > opened and time.monotonic() - self.welcomes[-1] >= STABLE_SESSION_S
        if stable:
            self.reconnect.reset()
            return 0.0
        return self.reconnect.next_delay()

    async def _connect_once(self) -> None:
        self.attempts.append(time.monotonic())
        async with connect(
            self.url, additional_headers={"Authorization": f"Bearer {self.token}"}, max_size=None, compression=None
        ) as ws:
            self._ws = ws
            channel = Channel(Role.AGENT)
            resume = self.session.resume_point() if self.session else None
            await ws.send(
                channel.send(
                    Hello(
                        device_id=self.device_id,
                        versions=[1],
                        labels=self.labels,
                        tools=self.tools,
                        info={"platform": "linux"},
                        resume=resume,
                    )
                )
            )  # type: ignore[arg-type]
            welcome = channel.receive(await ws.recv())
            assert isinstance(welcome, Welcome), welcome
            if self.session and self.session.resumed_by(welcome):
                resend = channel.open_agent(welcome, self.session)
            else:
                # A new session: the server re-sends every open batch, answered from `_seen`.
                self.session = Session(welcome.session_id, welcome.version)
                resend = channel.open_agent(welcome, self.session)
            for text in resend:
                await ws.send(text)
            self.heartbeat_s = welcome.heartbeat_interval_s
            self.welcomes.append(time.monotonic())
            self.welcomed.set()
            beat = asyncio.create_task(self._beat(ws, channel))
            try:
                async for data in ws:
                    msg = channel.receive(data)
                    if isinstance(msg, CommandBatch):
                        self.session.confirm(msg.seq)
                        done = self._seen.get(msg.batch_id)
                        if done is not None:
                            await ws.send(
                                channel.send(ResultBatch(batch_id=msg.batch_id, fence=msg.fence, results=done))
                            )
                            continue
                        if msg.batch_id in self._seen:
                            continue
                        self._seen[msg.batch_id] = None
                        if self.accept_by_results and self._work.empty():
                            late = asyncio.get_running_loop().call_later(
                                ACCEPT_AFTER_S, self._accept_late, msg.batch_id
                            )
                            self._unaccepted[msg.batch_id] = late
                        else:
                            await ws.send(channel.send(BatchAccepted(batch_id=msg.batch_id)))
                        self._work.put_nowait(msg)
                    elif isinstance(msg, Cancel):
                        self.session.confirm(msg.seq)
                        self._cancelled.add(msg.batch_id)
            finally:
                beat.cancel()
                self._ws = None
                self.welcomed.clear()

    def _accept_late(self, batch_id: str) -> None:
        if self._unaccepted.pop(batch_id, None) is not None and self._ws is not None and self.session is not None:
            sending = asyncio.ensure_future(self._ws.send(encode(self.session.stamp(BatchAccepted(batch_id=batch_id)))))
            self._sending.add(sending)
            sending.add_done_callback(self._sending.discard)

    async def _beat(self, ws: ClientConnection, channel: Channel) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            with contextlib.suppress(ConnectionClosed):
                await ws.send(channel.send(Heartbeat(state="idle")))

    async def _worker(self) -> None:
        while True:
            batch = await self._work.get()
            execution = Execution(batch.batch_id, batch.task_id, batch.node_id, batch.attempt, time.time())
            self.executions.append(execution)
            results: list[Result] = []
            stop = False
            for cmd in batch.commands:
                if stop or batch.batch_id in self._cancelled:
                    results.append(Result(call_id=cmd.call_id, status="skipped", namespace="sim"))
                    continue
                started = time.perf_counter()
                try:
                    handler = self.handlers.get(cmd.tool)
                    value = (
                        handler(cmd.arguments, batch.attempt)
                        if handler
                        else _default(cmd.tool, cmd.arguments, batch.attempt)
                    )
                    if asyncio.iscoroutine(value):
                        value = await value
                    results.append(
                        Result(
                            call_id=cmd.call_id,
                            status="success",
                            result=value,
                            namespace="sim",
                            duration_ms=(time.perf_counter() - started) * 1000,
                        )
                    )
                except ToolFailure as exc:
                    results.append(
                        Result(
                            call_id=cmd.call_id,
                            status="failure",
                            namespace="sim",
                            error=ErrorInfo(code=exc.code, message=str(exc)),
                        )
                    )
                    stop = True
            execution.ended = time.time()
            self._seen[batch.batch_id] = results
            if (late := self._unaccepted.pop(batch.batch_id, None)) is not None:
                late.cancel()  # the results accept it
            frame = ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=results)
            while True:  # deliver on this connection or the next one
                ws = self._ws
                if ws is not None and self.session is not None:
                    try:
                        await ws.send(encode(self.session.stamp(frame)))
                        break
                    except ConnectionClosed:
                        pass
                await asyncio.sleep(0.05)

    async def close(self) -> None:
        self._stop = True
        if self._ws is not None:
            await self._ws.close()


class SimFleet:
    """A background event loop hosting simulated devices for synchronous tests."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.new_event_loop()
        self.devices: list[SimDevice] = []
        self._tasks: list[asyncio.Future[None]] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def add(
        self,
        server_url: str,
        enrolled: dict[str, Any],
        labels: dict[str, str] | None = None,
        tools: list[ToolSpec] | None = None,
        handlers: dict[str, Handler] | None = None,
        wait: bool = True,
        reconnect: ReconnectPolicy | None = None,
        accept_by_results: bool = False,
    ) -> SimDevice:
        url = server_url.replace("http://", "ws://") + "/v1/agent"

        async def make() -> SimDevice:
            return SimDevice(
                url,
                enrolled["token"],
                enrolled["id"],
                labels or {},
                tools or list(DEFAULT_TOOLS),
                handlers or {},
                reconnect=reconnect,
                accept_by_results=accept_by_results,
            )

        device = asyncio.run_coroutine_threadsafe(make(), self.loop).result(10)
        self.devices.append(device)
        self._tasks.append(asyncio.run_coroutine_threadsafe(device.run(), self.loop))
        if wait:
            asyncio.run_coroutine_threadsafe(asyncio.wait_for(device.welcomed.wait(), 30), self.loop).result(35)
        return device

    def stop(self, device: SimDevice) -> None:
        asyncio.run_coroutine_threadsafe(device.close(), self.loop).result(10)

    def close(self) -> None:
        for d in self.devices:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(d.close(), self.loop).result(10)
        for t in self._tasks:
            with contextlib.suppress(Exception):
                t.result(10)

        async def drain() -> None:
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(drain(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
