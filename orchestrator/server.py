"""How `orrery serve` runs uvicorn: the checks before it starts, and the slow-client limits
(docs/explanation/security.md, request limits).

Before anything starts (the engine included), `claim_store` takes an exclusive lock on a SQLite
store, so a second server on the same data dir refuses at once instead of running its engine on
the live store, and `check_port` refuses a port already in use. A Postgres store takes no lock:
its replicas share it by design.

uvicorn on its own waits forever for a request head: a client that opens a connection and sends
nothing, or sends its headers one byte at a time (slowloris), holds the connection as long as it
likes. `HeadLimitsH11` closes a connection whose request head is not complete within
`ORRERY_HEADER_TIMEOUT_S` of the connection opening or of the head's first byte, and refuses a
head over `ORRERY_MAX_HEADER_BYTES`. The other limits are uvicorn's own (keep-alive, concurrency)
or the app's (body size and read time: orchestrator/app.py, `BodyLimit`).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from orchestrator.api.errors import problem_body
from orchestrator.config import Settings


def _answer(status: int, reason: str, code: str, detail: str) -> bytes:
    """A whole problem+json response that closes the connection, written before h11 has a
    request to answer (it refuses to send a response then)."""
    body = json.dumps(problem_body(status, code, detail)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "content-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    return head + body


_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")


class HeadLimitsH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline and a size limit for each request head.

    The clock starts when the connection opens, and again at the first byte of each later request
    on a kept-alive connection (the idle time between requests is uvicorn's keep-alive timeout).
    It stops when the head is complete, so a request body (the app's `BodyLimit` times that) and
    a long response such as an event stream are never cut by it. A client that sent part of a head
    gets a 408 problem before the close; one that sent nothing is just closed.

    h11's own limit (`h11_max_incomplete_event_size`) only applies while a head is incomplete: a
    head of any size that arrives in one read passes it. Here the head is measured before h11
    parses it, and one over `max_head_bytes` gets 431 and a close."""

    header_timeout_s = 10.0
    max_head_bytes = 16 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_head(opened=True)

    def handle_events(self) -> None:
        """Runs on new data and after each response (for a pipelined request)."""
        if self.conn.their_state is h11.IDLE and self._head_too_large():
            self.logger.warning("refusing a request head over %d bytes", self.max_head_bytes)
            self._close(
                _answer(
                    431,
                    "Request Header Fields Too Large",
                    "headers_too_large",
                    f"the request head is over the limit of {self.max_head_bytes} bytes",
                )
            )
            return
        super().handle_events()
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _head_too_large(self) -> bool:
        pending = self.conn.trailing_data[0]
        if len(pending) <= self.max_head_bytes:
            return False
        end = _END_OF_HEAD.search(pending, 0, self.max_head_bytes + 4)
        return end is None or end.end() > self.max_head_bytes

    def _waiting_for_head(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def _watch_head(self, opened: bool = False) -> None:
        """Start the clock on a new connection or at a head's first bytes; stop it once the head
        is in. An idle kept-alive connection (no bytes yet) is left to the keep-alive timeout."""
        if not self._waiting_for_head():
            self._stop_head_timer()
        elif self._head_timer is None and (opened or self.conn.trailing_data[0]):
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._waiting_for_head():
            return
        if not self.conn.trailing_data[0]:
            self._close(b"")  # nothing was asked, so nothing is answered
            return
        self.logger.warning("closing a connection whose request head took over %g s", self.header_timeout_s)
        detail = f"the request head did not arrive within {self.header_timeout_s:g} s"
        self._close(_answer(408, "Request Timeout", "request_timeout", detail))

    def _close(self, answer: bytes) -> None:
        self._stop_head_timer()
        if answer:
            self.transport.write(answer)
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:  # pragma: no cover - only ever called while waiting for a head
            pass
        self.transport.close()


def head_limits_protocol(timeout_s: float, max_bytes: int) -> type[HeadLimitsH11]:
    """`HeadLimitsH11` with its limits set (uvicorn builds the protocol from the class)."""

    class Configured(HeadLimitsH11):
        header_timeout_s = timeout_s
        max_head_bytes = max_bytes

    return Configured


def server_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn options for the slow-client limits; `orrery serve` passes them to uvicorn."""
    return {
        "http": head_limits_protocol(settings.header_timeout_s, settings.max_header_bytes),
        "timeout_keep_alive": settings.keepalive_timeout_s,
        "limit_concurrency": settings.max_connections,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
    }


class StartRefused(Exception):
    """`orrery serve` must not start; the message is the one line to show."""


_held: list[int] = []  # the store lock's fd, open for the life of the process (its close frees it)


def store_lock_path(settings: Settings) -> Path | None:
    """The lock file of a SQLite store (in the data dir for the default store, else beside the
    database file); None for Postgres or an in-memory database."""
    from sqlalchemy.engine import make_url

    url = make_url(settings.resolved_database_url)
    if not url.get_backend_name().startswith("sqlite") or not url.database or url.database == ":memory:":
        return None
    if settings.database_url is None:
        return settings.data_dir / "serve.lock"
    return Path(url.database).with_name(Path(url.database).name + ".lock")


def claim_store(settings: Settings) -> None:
    """Hold an exclusive lock on the SQLite store for as long as this process runs (the kernel
    frees it when the process ends, however it ends). StartRefused if another server holds it."""
    path = store_lock_path(settings)
    if path is None:
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock on this platform: start as before
        return
    where = settings.data_dir if settings.database_url is None else path.with_suffix("")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise StartRefused(f"another orrery serve is using {where} (pid {holder}); stop it first") from None
        raise StartRefused(f"cannot lock {path}: {exc.strerror or exc}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held.append(fd)


def check_port(host: str, port: int) -> None:
    """StartRefused if `host:port` cannot be listened on (in use, say). Bound as uvicorn binds it
    (SO_REUSEADDR, so a port left in TIME_WAIT passes), then released for uvicorn."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                raise StartRefused(
                    f"port {port} is in use: {reason} on {host} (another orrery serve?); pass --port"
                ) from None
            raise StartRefused(f"cannot listen on {host}:{port}: {reason}; check --host and --port") from None
