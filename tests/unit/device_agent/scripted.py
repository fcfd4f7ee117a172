"""The orchestrator's side of the device protocol played frame by frame, for agent tests.

The mirror of tests/rawdevice.py: a real WebSocket server on loopback that a real agent process
(`python -m device_agent`) connects to. Each test says which frames the "orchestrator" sends
(a stale fence, a passed deadline, a redelivery) and reads what the agent answers, which no
real orchestrator can be made to do on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve

from tests.support import ROOT, child_env

DEVICE = "dev_scripted"
TOKEN = f"orrd_{DEVICE}.not-checked-here"


class Connection:
    """One agent connection: numbered frames out, acknowledged frames in."""

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.clock_s = 0.0  # how far this "orchestrator's" clock is from the machine's
        self.seq = 0  # our reliable frames
        self.ack = 0  # the agent's reliable frames we have seen
        self.hello: dict[str, Any] = {}

    async def send(self, type_: str, reliable: bool = False, **payload: Any) -> None:
        seq = 0
        if reliable:
            self.seq += 1
            seq = self.seq
        await self.ws.send(json.dumps({"v": 1, "type": type_, "seq": seq, "ack": self.ack, **payload}))

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.clock_s)

    async def welcome(self, server_id: str | None = "srv-1", clock_s: float = 0.0, **extra: Any) -> None:
        """Welcome the agent; `clock_s` sets this server's clock off the device's by that much;
        `extra`: more welcome fields (`stopped`, `stop_reason`)."""
        self.clock_s = clock_s
        self.hello = await self.recv("hello")
        await self.send(
            "welcome",
            session_id=f"s-{uuid.uuid4().hex[:8]}",
            version=1,
            heartbeat_interval_s=0.5,
            heartbeat_timeout_s=60,
            max_frame_bytes=4 * 1024 * 1024,
            resumed=False,
            server_id=server_id,
            server_time=self.now().isoformat(),
            **extra,
        )

    async def batch(
        self, *commands: dict[str, Any], fence: int, deadline_in_s: float | None = 300, batch_id: str | None = None
    ) -> str:
        """Send a command_batch of `commands` (tool and arguments); returns its batch id."""
        batch_id = batch_id or f"b_{uuid.uuid4().hex[:12]}"
        deadline = None
        if deadline_in_s is not None:
            deadline = (self.now() + timedelta(seconds=deadline_in_s)).isoformat()
        await self.send(
            "command_batch",
            reliable=True,
            batch_id=batch_id,
            task_id="t1",
            node_id="n1",
            attempt=1,
            fence=fence,
            deadline=deadline,
            commands=[{"call_id": f"c{i}", "timeout_s": 30, **c} for i, c in enumerate(commands, 1)],
        )
        return batch_id

    async def recv(self, type_: str, timeout: float = 30) -> dict[str, Any]:
        """The next frame of `type_`; heartbeats are answered with our ack, as the orchestrator does."""
        async with asyncio.timeout(timeout):
            while True:
                frame: dict[str, Any] = json.loads(await self.ws.recv())
                if frame["seq"]:
                    self.ack = max(self.ack, frame["seq"])
                if frame["type"] == "heartbeat" and type_ != "heartbeat":
                    await self.send("heartbeat", state="idle")
                    continue
                if frame["type"] == type_:
                    return frame

    async def recv_any(self) -> dict[str, Any]:
        """The next frame, whatever it is (its seq counted into our ack)."""
        frame: dict[str, Any] = json.loads(await self.ws.recv())
        if frame["seq"]:
            self.ack = max(self.ack, frame["seq"])
        return frame

    async def result_for(self, batch_id: str, timeout: float = 30) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.recv("result_batch")
                if frame["batch_id"] == batch_id:
                    await self.send("heartbeat", state="idle")  # carries the ack: the outbox may let go
                    return frame


class ScriptedOrchestrator:
    def __init__(self) -> None:
        self.connections: asyncio.Queue[Connection] = asyncio.Queue()
        self._server: Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _handle(self, ws: ServerConnection) -> None:
        await self.connections.put(Connection(ws))
        await ws.wait_closed()

    async def next_connection(self, timeout: float = 30) -> Connection:
        async with asyncio.timeout(timeout):
            return await self.connections.get()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ScriptedOrchestrator]:
        async with serve(self._handle, "127.0.0.1", 0) as server:
            self._server = server
            yield self


class AgentProcess:
    """A real agent process pointed at the scripted orchestrator."""

    def __init__(self, data_dir: Path, url: str, **env: str) -> None:
        self.data_dir = data_dir
        self.url = url
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def workspace(self) -> Path:
        return self.data_dir / "workspace"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def start(self, **env: str) -> AgentProcess:
        args = [sys.executable, "-m", "device_agent", "--server", self.url, "--token", TOKEN]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*args, "--data-dir", str(self.data_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(**{**self.env, **env}),
                cwd=ROOT,
                start_new_session=True,
            )
        return self

    async def exited(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash or a power cut of the agent alone would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.asynccontextmanager
async def scripted(tmp_path: Path, **env: str) -> AsyncIterator[tuple[ScriptedOrchestrator, AgentProcess]]:
    """A scripted orchestrator and an agent process (not started) for it; the agent stops at the end."""
    async with ScriptedOrchestrator().running() as server:
        agent = AgentProcess(tmp_path / "agent", server.url, **env)
        try:
            yield server, agent
        finally:
            await asyncio.to_thread(agent.stop)
