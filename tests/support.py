"""Test support: real orchestrator and agent processes on loopback, and bounded waits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
TASK_ENDS = ("succeeded", "failed", "cancelled")  # the task states that end it
# One TLS context for every test client: httpx builds a fresh one per client otherwise (loading the
# CA bundle, ~10 ms of CPU), and the waits below make a client per poll.
TLS = ssl.create_default_context()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], T], timeout: float = 30.0, what: str = "condition", interval: float = 0.05) -> T:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORRERY_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(
    fleet: Fleet | None, *args: str, timeout: float = 60, cwd: Path = ROOT, columns: int = 160, **env: str
) -> subprocess.CompletedProcess[str]:
    """`orrery ARGS` as a user runs it, against `fleet`'s server with its admin key (if given)."""
    base = {"ORRERY_URL": fleet.server.url, "ORRERY_API_KEY": fleet.server.api_key} if fleet else {}
    return subprocess.run(
        [sys.executable, "-m", "orrery", *args],
        capture_output=True,
        text=True,
        env=child_env(**{"COLUMNS": str(columns), **base, **env}),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


@dataclass
class Server:
    data_dir: Path
    port: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    extra_args: list[str] = field(default_factory=list)
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.data_dir.parent / f"server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_key(self) -> str:
        return (self.data_dir / "admin.key").read_text().strip()

    def start(self) -> Server:
        self.launch()
        return self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> Server:
        """Until `/readyz` answers 200; fails early, with the log, if the process exits."""
        wait_until(self._ready, timeout, f"server on port {self.port} to be ready ({self.log_path})")
        return self

    def launch(self) -> Server:
        """Start the process without waiting for it to be ready (see `wait_ready`)."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "orchestrator.cli",
                    "serve",
                    "--port",
                    str(self.port),
                    "--data-dir",
                    str(self.data_dir),
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
            )
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1, verify=TLS).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key or self.api_key}"}, timeout=30, verify=TLS
        )


@dataclass
class Agent:
    name: str
    device_id: str
    token: str
    data_dir: Path
    server_url: str
    labels: dict[str, str]
    env: dict[str, str]
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "agent.log"

    @property
    def workspace(self) -> Path:
        return self.data_dir / "workspace"

    def start(self) -> Agent:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable,
            "-m",
            "device_agent",
            "--server",
            self.server_url,
            "--token",
            self.token,
            "--data-dir",
            str(self.data_dir),
            *self.extra_args,
        ]
        for k, v in self.labels.items():
            args += ["--label", f"{k}={v}"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT, start_new_session=True
            )
        return self

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def stop_agents(agents: list[Agent], timeout: float = 15) -> None:
    """`Agent.stop` for all of them at once: each is asked (SIGTERM) before any is waited for, so
    a teardown takes as long as the slowest agent, not the sum; one still running after `timeout`
    is killed, as `stop` does."""
    running = [a for a in agents if a.proc is not None and a.proc.poll() is None]
    for a in running:
        a.signal(signal.SIGCONT)
        a.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for a in running:
        assert a.proc is not None
        try:
            a.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            a.kill()


class Fleet:
    """A server plus agents for one test; everything is stopped at the end."""

    def __init__(self, tmp: Path, **server_env: str) -> None:
        self.tmp = tmp
        env = child_env(**{f"ORRERY_{k.upper()}": v for k, v in server_env.items()})
        self.server = Server(tmp / "server", free_port(), env)
        self.agents: list[Agent] = []
        self._database: contextlib.ExitStack | None = None

    def __enter__(self) -> Fleet:
        # ORRERY_TEST_BACKEND=postgres runs every fleet on a fresh Postgres database (same tests,
        # other backend); the session's server comes from tests/conftest.py.
        server = os.environ.get("ORRERY_TEST_POSTGRES_SERVER")
        if server and "ORRERY_DATABASE_URL" not in self.server.env:
            from tests.services import fresh_database

            self._database = contextlib.ExitStack()
            self.server.env["ORRERY_DATABASE_URL"] = self._database.enter_context(fresh_database(server))
        self.server.start()
        return self

    def __exit__(self, *_: object) -> None:
        stop_agents(self.agents)
        self.server.stop()
        if self._database is not None:
            self._database.close()

    def enroll(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        with self.server.client() as c:
            r = c.post("/v1/devices", json={"name": name, "labels": labels or {}})
            assert r.status_code == 201, r.text
            result: dict[str, Any] = r.json()
            return result

    def agent(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        start: bool = True,
        extra_args: list[str] | None = None,
        wait: bool = True,
        **env: str,
    ) -> Agent:
        enrolled = self.enroll(name, labels)
        agent = Agent(
            name,
            enrolled["id"],
            enrolled["token"],
            self.tmp / "agents" / name,
            self.server.url,
            labels or {},
            child_env(**env),
            extra_args or [],
        )
        self.agents.append(agent)
        if start:
            agent.start()
            if wait:
                self.wait_device(agent.device_id, "idle")
        return agent

    def device(self, device_id: str) -> dict[str, Any]:
        with self.server.client() as c:
            result: dict[str, Any] = c.get(f"/v1/devices/{device_id}").json()
            return result

    def wait_device(self, device_id: str, state: str, timeout: float = 60) -> dict[str, Any]:
        return wait_until(
            lambda: (d := self.device(device_id))["state"] == state and d,
            timeout,
            f"device {device_id} to be {state}",
        )

    def submit(self, dag: dict[str, Any], expect: int = 201, **body: Any) -> dict[str, Any]:
        with self.server.client() as c:
            r = c.post("/v1/tasks", json={"dag": dag, **body})
            assert r.status_code == expect, r.text
            result: dict[str, Any] = r.json()
            return result

    def task(self, task_id: str) -> dict[str, Any]:
        with self.server.client() as c:
            result: dict[str, Any] = c.get(f"/v1/tasks/{task_id}").json()
            return result

    def follow_task(
        self, task_id: str, timeout: float = 60, states: tuple[str, ...] = TASK_ENDS
    ) -> tuple[float, str] | None:
        """Follow the task's event stream to its first task event in one of `states` (bounded):
        `time.perf_counter()` when it came, and the state; None if the stream or the time ran out."""
        deadline = time.monotonic() + timeout
        with (
            contextlib.suppress(httpx.HTTPError),
            self.server.client() as c,
            c.stream("GET", f"/v1/tasks/{task_id}/events", timeout=httpx.Timeout(timeout, connect=5)) as resp,
        ):
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    data = json.loads(line[5:])
                    if data.get("node_id") is None and data.get("state") in states:
                        return time.perf_counter(), data["state"]
                if time.monotonic() > deadline:
                    break
        return None

    def wait_task(self, task_id: str, timeout: float = 60, states: tuple[str, ...] = TASK_ENDS) -> dict[str, Any]:
        """Follow the task's event stream until it reaches one of `states` (bounded); the task."""
        self.follow_task(task_id, timeout, states)
        return wait_until(lambda: (t := self.task(task_id))["state"] in states and t, 10, f"task {task_id} to end")

    def node(self, task: dict[str, Any], node_id: str) -> dict[str, Any]:
        return next(n for n in task["nodes"] if n["id"] == node_id)


def shell(argv: list[str], **kw: Any) -> dict[str, Any]:
    return {"tool": "shell.run", "arguments": {"argv": argv, **kw}}


@contextlib.contextmanager
def fleet(tmp: Path, **server_env: str) -> Iterator[Fleet]:
    with Fleet(tmp, **server_env) as f:
        yield f


class TcpProxy:
    """A loopback TCP proxy the test can sever, to cut live connections without killing anyone.

    `request_head`: rewrites the first HTTP request head of each connection (its bytes up to the
    blank line) before it goes on, e.g. to add a header a client under test cannot send."""

    def __init__(self, target_port: int, request_head: Callable[[bytes], bytes] | None = None) -> None:
        import asyncio
        import threading

        self.target_port = target_port
        self.request_head = request_head
        self.port = free_port()
        self.connections = 0
        self.attempts = 0  # every incoming connection, also those refused or failing upstream
        self.attempt_times: list[float] = []  # when each came (time.monotonic())
        self.paused = False
        self._writers: set[Any] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        import asyncio

        asyncio.set_event_loop(self._loop)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.attempts += 1
            self.attempt_times.append(time.monotonic())
            if self.paused:
                writer.transport.abort()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                writer.close()
                return
            self.connections += 1
            self._writers.update({writer, up_writer})
            if self.request_head is not None:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    writer.close()
                    up_writer.close()
                    return
                up_writer.write(self.request_head(head))
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            self._writers.difference_update({writer, up_writer})

        async def main() -> None:
            self._stop = asyncio.Event()
            server = await asyncio.start_server(handle, "127.0.0.1", self.port)
            self._ready.set()
            async with server:
                await self._stop.wait()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()
            await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}), return_exceptions=True)

        try:
            self._loop.run_until_complete(main())
        finally:
            self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sever(self) -> None:
        """Cut every live connection (both directions) at once."""

        def cut() -> None:
            for w in list(self._writers):
                transport = w.transport
                if transport is not None:
                    transport.abort()
            self._writers.clear()

        self._loop.call_soon_threadsafe(cut)

    def pause(self) -> None:
        """Cut every connection and refuse new ones until `resume`."""
        self.paused = True
        self.sever()

    def resume(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.sever()
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
