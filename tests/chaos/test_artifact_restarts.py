"""Artifact transfers under faults, for real (issue 20): the orchestrator killed with SIGKILL and
restarted in the middle of an upload and in the middle of a download, and the connection cut
mid-transfer, on SQLite (the files blob store) and Postgres (the database blob store).

Each agent reaches the orchestrator through a loopback proxy that holds the transfer to a steady
rate and counts the bytes it carries, so the fault lands mid-transfer and the test can tell a
transfer that resumed (about the file's size crossed the link) from one that started over.
The tools must end succeeded with the file intact; nothing else is acceptable.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_artifacts import MiB, random_file, sha_of
from tests.services import fresh_database
from tests.support import Agent, Fleet, free_port, wait_until

SIZE = 40 * MiB
RATE = 10 * MiB  # bytes per second each way through the proxy: a transfer takes ~4 s
FAULT_AT = 16 * MiB  # the fault comes once this much has crossed
# Bytes a fault may cost: what was on its way (socket buffers, the piece in flight) is sent again.
LOST_AT_MOST = 10 * MiB


class SlowLink:
    """A loopback TCP proxy to `target_port` that forwards each way at most `rate` bytes/s and
    counts what it forwarded; `sever()` cuts every connection through it."""

    def __init__(self, target_port: int, rate: int) -> None:
        self.target_port = target_port
        self.rate = rate
        self.port = free_port()
        self.up = 0  # bytes forwarded towards the orchestrator
        self.down = 0  # and back
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await self._stop.wait()
        rest = asyncio.all_tasks() - {asyncio.current_task()}
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer, "up"), self._pipe(up_reader, writer, "down"))
        self._writers -= {writer, up_writer}

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, way: str) -> None:
        started, sent = time.monotonic(), 0
        try:
            while data := await reader.read(64 * 1024):
                writer.write(data)
                await writer.drain()
                sent += len(data)
                setattr(self, way, getattr(self, way) + len(data))
                ahead = sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def sever(self) -> None:
        def cut() -> None:
            for w in list(self._writers):
                if w.transport is not None:
                    w.transport.abort()
            self._writers.clear()

        self._loop.call_soon_threadsafe(cut)

    def close(self) -> None:
        """Stop forwarding (new connections are refused); closing again does nothing."""
        if self._loop.is_closed():
            return
        self.sever()
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@contextlib.contextmanager
def fleet_on(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    with contextlib.ExitStack() as stack:
        env: dict[str, str] = {"heartbeat_interval_s": "2"}
        if backend == "postgres":
            env["database_url"] = stack.enter_context(fresh_database(request.getfixturevalue("postgres_url")))
        else:  # named, so ORRERY_TEST_BACKEND=postgres leaves this one on SQLite
            env["database_url"] = f"sqlite+aiosqlite:///{tmp_path}/server/orrery.db"
        yield stack.enter_context(Fleet(tmp_path, **env))


def agent_via(fleet: Fleet, name: str, link: SlowLink | None) -> Agent:
    agent = fleet.agent(name, start=False)
    if link is not None:
        agent.server_url = link.url
    agent.start()
    fleet.wait_device(agent.device_id, "idle")
    return agent


def moving(producer: Agent, consumer: Agent) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "id": "pub",
                "placement": {"device": producer.device_id},
                "commands": [{"tool": "files.publish_artifact", "arguments": {"path": "big.bin"}, "timeout_s": 180}],
            },
            {
                "id": "get",
                "placement": {"device": consumer.device_id},
                "commands": [
                    {
                        "tool": "files.fetch_artifact",
                        "arguments": {"path": "in/big.bin", "name": "big.bin"},
                        "timeout_s": 180,
                    }
                ],
            },
        ],
        "edges": [{"from": "pub", "to": "get"}],
    }


def restart(fleet: Fleet) -> None:
    fleet.server.kill(signal.SIGKILL)  # no shutdown: whatever was in flight is lost
    fleet.server.start()


def check_moved(fleet: Fleet, task: dict[str, Any], consumer: Agent, digest: str) -> tuple[int, int]:
    """The task succeeded with the file intact; how often each tool had to try again."""
    done = fleet.wait_task(task["id"], timeout=240)
    assert done["state"] == "succeeded", [(n["id"], n["state"], n.get("error")) for n in done["nodes"]]
    published, fetched = fleet.node(done, "pub")["output"], fleet.node(done, "get")["output"]
    assert published["sha256"] == fetched["sha256"] == digest and fetched["size"] == SIZE
    assert sha_of(consumer.workspace / "in" / "big.bin") == digest
    assert sorted(p.name for p in (consumer.workspace / "in").iterdir()) == ["big.bin"]
    assert len(fleet.node(done, "pub")["attempts"]) == len(fleet.node(done, "get")["attempts"]) == 1
    return int(published["retries"]), int(fetched["retries"])


BACKENDS = ["sqlite", "postgres"]


@pytest.mark.parametrize("way", ["upload", "download"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_orchestrator_killed_mid_transfer_comes_back_and_the_transfer_resumes(
    tmp_path: Path, backend: str, way: str, request: pytest.FixtureRequest
) -> None:
    with fleet_on(backend, tmp_path, request) as f:
        link = SlowLink(f.server.port, RATE)
        try:
            slow = "producer" if way == "upload" else "consumer"  # the agent whose transfer is watched
            producer = agent_via(f, "producer", link if slow == "producer" else None)
            consumer = agent_via(f, "consumer", link if slow == "consumer" else None)
            digest = random_file(producer.workspace / "big.bin", SIZE)
            task = f.submit(moving(producer, consumer))
            crossed = (lambda: link.up) if way == "upload" else (lambda: link.down)
            wait_until(lambda: crossed() >= FAULT_AT, 90, f"the {way} to be well under way", interval=0.01)
            restart(f)
            retries = dict(zip(("upload", "download"), check_moved(f, task, consumer, digest), strict=True))
            print(f"{way} through a restart ({backend}): {crossed()} bytes crossed, {retries[way]} retries")
            assert retries[way] >= 1  # it was cut, and went on
            assert crossed() < SIZE + LOST_AT_MOST, f"{crossed()} bytes crossed: the {way} started over"
        finally:
            link.close()


def test_connections_cut_mid_upload_and_mid_download_resume_both(tmp_path: Path) -> None:
    with Fleet(tmp_path, heartbeat_interval_s="2") as f:
        up, down = SlowLink(f.server.port, RATE), SlowLink(f.server.port, RATE)
        try:
            producer, consumer = agent_via(f, "producer", up), agent_via(f, "consumer", down)
            digest = random_file(producer.workspace / "big.bin", SIZE)
            task = f.submit(moving(producer, consumer))
            wait_until(lambda: up.up >= FAULT_AT, 60, "the upload to be well under way", interval=0.01)
            up.sever()
            wait_until(lambda: down.down >= FAULT_AT, 90, "the download to be well under way", interval=0.01)
            down.sever()
            retried_up, retried_down = check_moved(f, task, consumer, digest)
            assert retried_up >= 1 and retried_down >= 1
            assert up.up < SIZE + LOST_AT_MOST and down.down < SIZE + LOST_AT_MOST
        finally:
            up.close()
            down.close()
