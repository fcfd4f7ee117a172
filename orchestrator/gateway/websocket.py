"""How uvicorn serves the device WebSocket: frame limit, compression, the close code for a frame
over the limit (SPEC section 4: 4413, not the library's 1009), and frames handed to the gateway
as they arrive.

The limit is enforced twice: websockets refuses a frame whose header announces more than
`max_frame_bytes` before reading its payload (so an oversized frame costs no memory), and the
codec checks every frame it decodes. Both answer the same way: an `error` frame with code
`frame_too_large`, then close 4413.

Frames as they arrive: through ASGI, every frame is a `receive()` the application awaits, and an
idle device's connection keeps a chain of coroutines and a future waiting for its next frame,
rebuilt after every heartbeat. At 10,000 devices those ~200,000 objects live a heartbeat interval
each, long enough to be promoted to the collector's oldest generation, and the full collections
they set off paused the server for up to a second. So after the handshake, the gateway attaches
a `FrameSink` (the scope's `orrery.frames` extension) and this protocol calls it with each frame
and with the disconnect, in order, with nothing waiting in between; the sink pauses reading
(`hold`) while it is busy with a frame, which is the backpressure `receive()` gave. A frame to
send is written at once when the connection would take it without waiting (`write_text`); else
it, and the close, go through ASGI.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State
from websockets.server import ServerProtocol

from orchestrator.config import Settings
from protocol.codec import WS_MESSAGE_TOO_BIG, oversize_answer

FRAMES_EXTENSION = "orrery.frames"  # scope["extensions"][FRAMES_EXTENSION] is `attach`


class FrameSink(Protocol):
    def frame(self, data: str | bytes) -> None:
        """One whole data frame from the device."""

    def gone(self, code: int | None = None) -> None:
        """The connection ended (either side closed it, or it broke; `code` is the close code
        uvicorn reports, the peer's when it closed first); no frame follows."""


class FrameFlow(Protocol):
    """What a sink may ask of the connection that feeds it."""

    def hold(self) -> None:
        """Stop reading from the socket until `release`."""

    def release(self) -> None:
        """Read again."""

    def write_text(self, text: str) -> bool:
        """Write one frame now if the connection takes it without waiting (open, no close sent,
        no backpressure); False means it did not, and the frame goes the ASGI way."""


class FrameLimitedServerProtocol(ServerProtocol):
    """websockets' server protocol, answering a frame over `max_size` as SPEC section 4 says."""

    def fail(self, code: int, reason: str = "") -> None:
        if code == WS_MESSAGE_TOO_BIG and self.state is State.OPEN:
            frame, code, reason = oversize_answer(self.max_message_size or 0, reason)
            self.send_text(frame.encode())
        super().fail(code, reason)


class _Inbox(asyncio.Queue[Any]):
    """uvicorn's receive queue. Once a sink is attached, the disconnect (put here from several
    places in uvicorn) goes to the sink instead."""

    sink: FrameSink | None = None

    def put_nowait(self, item: Any) -> None:
        if self.sink is not None:
            if item["type"] == "websocket.disconnect":
                self.sink.gone(item.get("code"))
            return
        super().put_nowait(item)


class GatewayWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio implementation with `FrameLimitedServerProtocol` inside, which
    hands frames to an attached `FrameSink`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn builds a plain ServerProtocol with our options (max_size, extensions); the
        # subclass adds no state, only the close code, so re-classing keeps every option as is.
        self.conn.__class__ = FrameLimitedServerProtocol
        self.queue = self.inbox = _Inbox()
        self.held = False

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # none when the upgrade was refused
        if scope is not None:
            scope["extensions"][FRAMES_EXTENSION] = self.attach

    def attach(self, sink: FrameSink) -> FrameFlow:
        """From now on, frames and the disconnect go to `sink`, starting with any that arrived
        before it was attached; the application must not call `receive()` any more."""
        early = []
        while not self.inbox.empty():
            early.append(self.inbox.get_nowait())
        self.inbox.sink = sink
        for event in early:
            if event["type"] == "websocket.receive":
                text = event.get("text")
                sink.frame(text if text is not None else event.get("bytes") or b"")
            else:
                self.inbox.put_nowait(event)
        if self.read_paused and not self.held:
            self.read_paused = False
            self.transport.resume_reading()
        return self

    def hold(self) -> None:
        self.held = True
        if not self.read_paused and not self.close_sent:  # after our close, read the peer's reply
            self.read_paused = True
            self.transport.pause_reading()

    def release(self) -> None:
        self.held = False
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def write_text(self, text: str) -> bool:
        """A frame straight to the socket, as uvicorn's `send` writes it once it may (the ASGI
        send awaited `writable` and cost a task and a loop turn per frame). Only when nothing
        would make that send wait or refuse: otherwise the caller queues it for ASGI."""
        if (
            self.close_sent
            or not self.writable.is_set()
            or self.conn.state is not State.OPEN
            or self.transport.is_closing()
        ):
            return False
        self.conn.send_text(text.encode())
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    def send_receive_event_to_app(self) -> None:
        sink = self.inbox.sink
        if sink is None:
            super().send_receive_event_to_app()
            return
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        if self.close_sent:  # past our close: read on until the peer's close reply, as uvicorn does
            return
        if self.curr_msg_data_type == "bytes":
            sink.frame(bytes(data))
            return
        try:
            text = bytes(data).decode()
        except UnicodeDecodeError:
            self.conn.send_close(1007)
            self.handle_parser_exception()
            return
        sink.frame(text)


def websocket_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn settings for the device WebSocket."""
    return {
        "ws": GatewayWebSocketProtocol,
        "ws_max_size": settings.max_frame_bytes,
        "ws_per_message_deflate": False,
    }
