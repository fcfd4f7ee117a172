"""How uvicorn serves the device WebSocket: frame limit, compression, and the close code for a
frame over the limit (SPEC section 4: 4413, not the library's 1009).

The limit is enforced twice: websockets refuses a frame whose header announces more than
`max_frame_bytes` before reading its payload (so an oversized frame costs no memory), and the
codec checks every frame it decodes. Both answer the same way: an `error` frame with code
`frame_too_large`, then close 4413.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State
from websockets.server import ServerProtocol

from orchestrator.config import Settings
from protocol.codec import WS_MESSAGE_TOO_BIG, oversize_answer


class FrameLimitedServerProtocol(ServerProtocol):
    """websockets' server protocol, answering a frame over `max_size` as SPEC section 4 says."""

    def fail(self, code: int, reason: str = "") -> None:
        if code == WS_MESSAGE_TOO_BIG and self.state is State.OPEN:
            frame, code, reason = oversize_answer(self.max_message_size or 0, reason)
            self.send_text(frame.encode())
        super().fail(code, reason)


class GatewayWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio implementation with `FrameLimitedServerProtocol` inside."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn builds a plain ServerProtocol with our options (max_size, extensions); the
        # subclass adds no state, only the close code, so re-classing keeps every option as is.
        self.conn.__class__ = FrameLimitedServerProtocol


def websocket_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn settings for the device WebSocket."""
    return {
        "ws": GatewayWebSocketProtocol,
        "ws_max_size": settings.max_frame_bytes,
        "ws_per_message_deflate": False,
    }
