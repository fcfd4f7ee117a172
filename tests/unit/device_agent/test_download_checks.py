"""The agent checks what it downloads: `fetch` keeps an artifact only if the bytes it received
have the sha256 the orchestrator announced for it. Against a small real HTTP server on loopback
that plays the orchestrator's artifact routes and can damage the bytes it sends."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from device_agent.artifacts import fetch
from device_agent.transfer import ROUTES, ArtifactLink, Connection, TransferError

CONTENT = b"the report, as it was published\n" * 64
SHA256 = hashlib.sha256(CONTENT).hexdigest()


class Orchestrator(ThreadingHTTPServer):
    """Announces one artifact (CONTENT, by its sha256) and sends `body` as its content."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Routes)
        self.body = CONTENT
        self.downloads = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Routes(BaseHTTPRequestHandler):
    server: Orchestrator

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == ROUTES:
            self.answer("application/json", json.dumps({"name": "report.txt", "size": len(CONTENT), "sha256": SHA256}))
        elif path == f"{ROUTES}/{SHA256}/content":
            self.server.downloads += 1
            self.answer("application/octet-stream", self.server.body)
        else:
            self.send_error(404)

    def answer(self, kind: str, body: str | bytes) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def orchestrator() -> Iterator[Orchestrator]:
    server = Orchestrator()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)  # quick to shut down
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def connection(server: Orchestrator) -> Connection:
    link = ArtifactLink((server.url,), "orrd_dev_x.secret", None, 1 << 20)
    return Connection(link, deadline=time.monotonic() + 60)


async def test_a_download_with_the_announced_sha256_is_put_in_place(orchestrator: Orchestrator, tmp_path: Path) -> None:
    target = tmp_path / "report.txt"
    async with connection(orchestrator) as conn:
        meta = await fetch(conn, "b_1", "report.txt", None, target)
    assert meta["sha256"] == SHA256 and target.read_bytes() == CONTENT


async def test_a_download_whose_sha256_does_not_match_is_refused_and_leaves_nothing(
    orchestrator: Orchestrator, tmp_path: Path
) -> None:
    orchestrator.body = CONTENT[:-2] + b"?\n"  # damaged on the way: the same size, other bytes
    target = tmp_path / "report.txt"
    target.write_bytes(b"the version the node had before\n")
    async with connection(orchestrator) as conn:
        with pytest.raises(TransferError) as refused:
            await fetch(conn, "b_1", "report.txt", None, target)
    assert refused.value.code == "integrity_error"
    assert orchestrator.downloads == 2  # tried once more from the start before giving up
    assert target.read_bytes() == b"the version the node had before\n"
    assert os.listdir(tmp_path) == ["report.txt"]  # no partial download left behind
