"""A raw protocol device with a screen, for the live view tests: it answers `view` with a stream
of `view_frame`s (small PNGs whose colour changes with every frame), stops when told (`on:
false`) or when its lease runs out, and answers `view_input` as the test scripts it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import struct
import time
import zlib
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

WAIT_S = 30.0
COLOURS = [(220, 40, 40), (40, 200, 60), (40, 80, 220), (230, 200, 30)]


def png(rgb: tuple[int, int, int], width: int = 8, height: int = 6) -> bytes:
    """A solid-colour PNG, written by hand (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


class ScreenDevice:
    """One session on a real socket. `views` collects every `view` frame received, `inputs` every
    `view_input`, `batches` every `command_batch` (left unanswered: its node stays running);
    `refuse_watch` answers a view with `view_ended` of that code instead of frames;
    `input_answer` is the (ok, code) each input gets, or None to leave inputs unanswered."""

    def __init__(
        self,
        server_url: str,
        device_id: str,
        token: str,
        features: tuple[str, ...] = ("view",),
        refuse_watch: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.url = server_url.replace("http://", "ws://") + "/v1/agent"
        self.device_id, self.token, self.features = device_id, token, features
        self.refuse_watch = refuse_watch
        self.tools = tools or []  # its catalogue (a `gui.*` tool says it has a screen); batches wait unanswered
        self.batches: list[dict[str, Any]] = []
        self.controls: list[dict[str, Any]] = []  # `device_control` frames (takeovers among them)
        self.input_answer: tuple[bool, str] | None = (True, "")
        self.views: list[dict[str, Any]] = []
        self.inputs: list[dict[str, Any]] = []
        self.streams: dict[str, asyncio.Task[None]] = {}
        self.frames_sent = 0
        self._heard = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ack = 0
        self._leases: dict[str, float] = {}

    async def __aenter__(self) -> ScreenDevice:
        self._ws = await connect(self.url, additional_headers={"Authorization": f"Bearer {self.token}"})
        await self._send(
            "hello",
            device_id=self.device_id,
            versions=[1],
            tools=self.tools,
            resume=None,
            info={"platform": "linux"},
            features=list(self.features),
        )
        async with asyncio.timeout(WAIT_S):
            while json.loads(await self._ws.recv())["type"] != "welcome":
                pass
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._beat())]
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.leave()

    async def leave(self, code: int = 1001) -> None:
        """Close the socket as a stopping agent does (1001: the device is gone at once)."""
        for task in [*self._tasks, *self.streams.values()]:
            task.cancel()
        for task in [*self._tasks, *self.streams.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks, self.streams = [], {}
        if self._ws is not None:
            await self._ws.close(code)

    async def next_view(self, after: int, on: bool | None = None) -> dict[str, Any]:
        """The first `view` frame received after the first `after` ones (of `on`, if given)."""
        async with asyncio.timeout(WAIT_S):
            while True:
                for frame in self.views[after:]:
                    if on is None or frame["on"] is on:
                        return frame
                self._heard.clear()
                await self._heard.wait()

    async def next_input(self, after: int) -> dict[str, Any]:
        async with asyncio.timeout(WAIT_S):
            while len(self.inputs) <= after:
                self._heard.clear()
                await self._heard.wait()
        return self.inputs[after]

    async def _send(self, type_: str, **payload: Any) -> None:
        assert self._ws is not None
        await self._ws.send(json.dumps({"v": 1, "type": type_, "seq": 0, "ack": self._ack, **payload}))

    async def _beat(self) -> None:
        while True:
            await self._send("heartbeat", state="idle", batch_id=None)
            await asyncio.sleep(2)

    async def _read(self) -> None:
        assert self._ws is not None
        async for data in self._ws:
            frame = json.loads(data)
            if frame["seq"]:
                self._ack = frame["seq"]
            if frame["type"] == "view":
                frame["_t"] = time.monotonic()
                self.views.append(frame)
                await self._on_view(frame)
            elif frame["type"] == "device_control":
                self.controls.append(frame)
            elif frame["type"] == "command_batch":
                self.batches.append(frame)
            elif frame["type"] == "view_input":
                self.inputs.append(frame)
                if self.input_answer is not None:
                    ok, code = self.input_answer
                    message = "" if ok else f"refused ({code})"
                    await self._send("view_input_result", input_id=frame["input_id"], ok=ok, code=code, message=message)
            self._heard.set()

    async def _on_view(self, frame: dict[str, Any]) -> None:
        stream_id = frame["stream_id"]
        if not frame["on"]:
            task = self.streams.pop(stream_id, None)
            if task is not None:
                task.cancel()
            return
        if self.refuse_watch is not None:
            await self._send("view_ended", stream_id=stream_id, code=self.refuse_watch, message="the owner said no")
            return
        self._leases[stream_id] = time.monotonic() + float(frame["lease_s"])
        if stream_id not in self.streams:
            self.streams[stream_id] = asyncio.create_task(self._stream(stream_id, float(frame["fps"])))

    async def _stream(self, stream_id: str, fps: float) -> None:
        n = 0
        while time.monotonic() < self._leases[stream_id]:
            n += 1
            image = base64.b64encode(png(COLOURS[n % len(COLOURS)])).decode()
            await self._send(
                "view_frame",
                stream_id=stream_id,
                n=n,
                source="x11",
                mime="image/png",
                image_b64=image,
                width=8,
                height=6,
                screen_width=1600,
                screen_height=1200,
                marks=[{"id": 1, "name": "OK button", "x": 1, "y": 1, "w": 3, "h": 2}],
            )
            self.frames_sent += 1
            await asyncio.sleep(1 / fps)
        self.streams.pop(stream_id, None)
        await self._send("view_ended", stream_id=stream_id, code="lease_expired", message="no renewal came")
