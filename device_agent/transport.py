"""The agent's WebSocket client: the only module on this side that imports `websockets`."""

from __future__ import annotations

import contextlib
import json
import ssl
from pathlib import Path
from types import TracebackType
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.protocol import State

from protocol.codec import WS_MESSAGE_TOO_BIG, encode, oversize_answer
from protocol.errors import ProtocolError
from protocol.messages import Error

PING_INTERVAL_S = 20.0


class Refused(Exception):
    """The server refused the upgrade (HTTP status) before any frame."""

    def __init__(self, status: int, body: str) -> None:
        self.status = status
        self.detail = problem_detail(body)
        super().__init__(f"the server refused the connection with HTTP {status}: {self.detail}")


def problem_detail(body: str) -> str:
    """The sentence of an error body: a problem document's `detail`, never the raw JSON."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("detail", "title", "code"):
            if isinstance(doc.get(key), str) and doc[key]:
                return str(doc[key])[:300]
    text = " ".join(body.split())
    return text[:200] or "no reason given"


# What OpenSSL says when the server answered a TLS hello with something that is not TLS (most
# often a plain-HTTP server's error page): the server is there, it just does not speak TLS.
NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"})


class NotTls(Exception):
    """A `wss://` (https) connection reached a server that answered without TLS."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(
            f"the server at {url} answered, but not with TLS: it serves plain http. Use an http:// "
            "(ws://) --server URL, or start the server with --tls-cert and --tls-key"
        )


def not_tls(exc: BaseException) -> bool:
    """`exc` is OpenSSL's complaint that the peer's answer to a TLS hello was not TLS."""
    return isinstance(exc, ssl.SSLError) and (
        getattr(exc, "reason", None) in NOT_TLS_REASONS or any(r in str(exc) for r in NOT_TLS_REASONS)
    )


class Closed(Exception):
    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"connection closed ({code}): {reason}")
        self.code = code
        self.reason = reason


def ssl_context(url: str, ca_file: Path | None) -> ssl.SSLContext | None:
    if not url.startswith("wss://"):
        return None
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    return ctx


class _FrameLimitedClientProtocol(ClientProtocol):
    """websockets' client protocol, answering a frame over `max_size` with 4413 (SPEC section 4)
    instead of the library's 1009, after an `error` frame that says why."""

    def fail(self, code: int, reason: str = "") -> None:
        if code == WS_MESSAGE_TOO_BIG and self.state is State.OPEN:
            frame, code, reason = oversize_answer(self.max_message_size or 0, reason)
            self.send_text(frame.encode())
        super().fail(code, reason)


class _Connection(ClientConnection):
    def __init__(self, protocol: ClientProtocol, **kwargs: Any) -> None:
        # The subclass adds no state, only the close code: re-classing keeps every option.
        protocol.__class__ = _FrameLimitedClientProtocol
        super().__init__(protocol, **kwargs)


class Transport:
    def __init__(self, url: str, token: str, max_frame_bytes: int, ca_file: Path | None = None) -> None:
        self.url = url
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self.ca_file = ca_file
        self._conn: ClientConnection | None = None

    async def __aenter__(self) -> Transport:
        try:
            self._conn = await connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                # A server frame over the limit is refused before its payload is read (4413).
                max_size=self.max_frame_bytes,
                create_connection=_Connection,
                open_timeout=10,
                ping_interval=PING_INTERVAL_S,
                ping_timeout=PING_INTERVAL_S,
                close_timeout=5,
                ssl=ssl_context(self.url, self.ca_file),
                user_agent_header="orrery-agent",
                compression=None,
            )
        except InvalidStatus as exc:
            body = exc.response.body.decode("utf-8", "replace") if exc.response.body else ""
            raise Refused(exc.response.status_code, body) from None
        except ssl.SSLError as exc:
            if not_tls(exc):
                raise NotTls(self.url) from None
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._conn is None:
            return
        if isinstance(exc, ProtocolError):
            # Tell the server what was wrong with its frame, and close with the code SPEC
            # section 4 gives it (4400, 4413, 4426), as the server does with ours.
            with contextlib.suppress(ConnectionClosed):
                await self._conn.send(encode(Error(code=exc.code, message=exc.message)))
            await self._conn.close(exc.close_code, exc.code.value)
            return
        await self._conn.close()

    async def send(self, text: str) -> None:
        conn = self._conn
        assert conn is not None
        if _takes_at_once(conn):
            # What the library's `send` does for one text message on an open connection whose
            # socket is not pushing back: frame it, write it; its `drain` would not wait. Without
            # the async context manager and the await it costs a third as much, on every frame.
            try:
                conn.protocol.send_text(text.encode())
                conn.send_data()
            except Exception as exc:  # the socket failed under us: end the connection as `send` would
                conn.transport.abort()
                raise Closed(None, f"the connection failed while sending: {exc}") from exc
            return
        try:
            await conn.send(text)
        except ConnectionClosed as exc:
            raise Closed(exc.rcvd.code if exc.rcvd else None, exc.rcvd.reason if exc.rcvd else "") from None

    async def recv(self) -> str | bytes:
        assert self._conn is not None
        try:
            return await self._conn.recv()
        except ConnectionClosed as exc:
            raise Closed(exc.rcvd.code if exc.rcvd else None, exc.rcvd.reason if exc.rcvd else "") from None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self._conn is not None:
            await self._conn.close(code, reason)


def _takes_at_once(conn: ClientConnection) -> bool:
    """Whether a frame can be written now without waiting: the connection is open, no fragmented
    message is being sent, and the transport has not asked us to stop writing (backpressure)."""
    return (
        conn.protocol.state is State.OPEN
        and getattr(conn, "send_in_progress", True) is None
        and getattr(conn, "paused", True) is False
        and not conn.transport.is_closing()
    )
