"""Saving an artifact to a file (`Client.download`, `AsyncClient.download`) over a scripted
transport: a dropped stream resumes with a `Range` for the rest, a server that sends the whole
content again is followed, and neither damaged bytes nor a download that never finishes leaves
a file behind (orrery/sdk/download.py)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest

from orrery import AsyncClient, Client, ServerError, Unavailable

CONTENT = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(CONTENT).hexdigest()
RECORD_PATH = "/v1/tasks/t1/artifacts/report.bin"
CONTENT_PATH = "/v1/tasks/t1/artifacts/report.bin/content"


class Cut(httpx2.SyncByteStream, httpx2.AsyncByteStream):
    """A body that sends `data` and then, if `cut`, drops the connection."""

    def __init__(self, data: bytes, cut: bool) -> None:
        self.data, self.cut = data, cut

    def __iter__(self) -> Iterator[bytes]:
        yield self.data
        if self.cut:
            raise httpx2.ReadError("connection reset by peer")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data
        if self.cut:
            raise httpx2.ReadError("connection reset by peer")


class Server:
    """The artifact's record, and its content answered as `script` says, one entry per stream:
    `cut` (half, then the connection drops), `rest` (honours a Range), `whole` (ignores it),
    `damaged` (the whole content with one byte changed)."""

    def __init__(self, *script: str) -> None:
        self.script = list(script)
        self.ranges: list[str | None] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path == RECORD_PATH:
            return httpx2.Response(200, json=record())
        assert request.url.path == CONTENT_PATH and request.url.params["version"] == "2"
        self.ranges.append(request.headers.get("Range"))
        how = self.script.pop(0)
        start = int(request.headers["Range"].removeprefix("bytes=").rstrip("-")) if "Range" in request.headers else 0
        if how == "cut":
            return httpx2.Response(200, stream=Cut(CONTENT[: len(CONTENT) // 2], cut=True))
        if how == "rest":
            assert request.headers["If-Range"] == f'"{SHA}"'
            return httpx2.Response(206, stream=Cut(CONTENT[start:], cut=False))
        if how == "damaged":
            return httpx2.Response(200, stream=Cut(b"X" + CONTENT[1:], cut=False))
        return httpx2.Response(200, stream=Cut(CONTENT, cut=False))


def record() -> dict[str, object]:
    return {
        "id": "a1",
        "task_id": "t1",
        "name": "report.bin",
        "version": 2,
        "current": True,
        "sha256": SHA,
        "size": len(CONTENT),
        "content_url": f"{CONTENT_PATH}?version=2",
    }


def client(server: Server) -> Client:
    return Client("http://orrery.test", "orrk_x", transport=httpx2.MockTransport(server))


def test_a_dropped_download_resumes_with_the_rest_and_is_saved_whole(tmp_path: Path) -> None:
    server = Server("cut", "rest")
    with client(server) as c:
        saved = c.download("t1", "report.bin", tmp_path / "report.bin")
    assert (tmp_path / "report.bin").read_bytes() == CONTENT
    assert saved.version == 2 and saved.sha256 == SHA
    assert server.ranges == [None, f"bytes={len(CONTENT) // 2}-"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.bin"]  # no partial file left


def test_a_server_that_sends_the_whole_content_again_is_followed(tmp_path: Path) -> None:
    with client(Server("cut", "whole")) as c:
        c.download("t1", "report.bin", tmp_path / "report.bin")
    assert (tmp_path / "report.bin").read_bytes() == CONTENT


def test_damaged_bytes_are_an_integrity_error_and_nothing_is_saved(tmp_path: Path) -> None:
    (tmp_path / "report.bin").write_text("the old file\n")
    with client(Server("damaged")) as c, pytest.raises(ServerError) as caught:
        c.download("t1", "report.bin", tmp_path / "report.bin")
    assert caught.value.code == "integrity_error"
    assert (tmp_path / "report.bin").read_text() == "the old file\n"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.bin"]


def test_a_download_dropped_at_every_try_is_unreachable_and_nothing_is_saved(tmp_path: Path) -> None:
    with client(Server("cut", "cut", "cut", "cut")) as c, pytest.raises(Unavailable) as caught:
        c.download("t1", "report.bin", tmp_path / "report.bin")
    assert caught.value.code == "unreachable" and "try again" in caught.value.detail
    assert list(tmp_path.iterdir()) == []


async def test_the_async_client_resumes_a_dropped_download_too(tmp_path: Path) -> None:
    server = Server("cut", "rest")
    async with AsyncClient("http://orrery.test", "orrk_x", transport=httpx2.MockTransport(server)) as c:
        saved = await c.download("t1", "report.bin", tmp_path / "report.bin")
    assert (tmp_path / "report.bin").read_bytes() == CONTENT and saved.name == "report.bin"
    assert server.ranges == [None, f"bytes={len(CONTENT) // 2}-"]
