"""What both clients say when the server cannot be reached, and how long they wait for it."""

from __future__ import annotations

import time

import httpx2

from orrery.sdk.errors import Unavailable, WaitTimeout
from orrery.sdk.stream import READ_TIMEOUT_S

# OpenSSL's words for an answer to a TLS hello that was not TLS.
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG")


def unreachable(exc: Exception, server: str) -> Unavailable:
    """A failure to talk to the server as an `Unavailable` error (code `unreachable`) that says
    what to check; never the transport's own exception."""
    if isinstance(exc, httpx2.ConnectError) and any(r in str(exc) for r in _NOT_TLS):
        detail = (
            f"the orchestrator at {server} answered, but not with TLS: it serves plain http. "
            "Use an http:// URL, or start the server with --tls-cert and --tls-key"
        )
    elif isinstance(exc, httpx2.ConnectError):
        detail = f"cannot reach the orchestrator at {server}: is `orrery serve` running?"
    elif isinstance(exc, httpx2.TimeoutException):
        detail = f"the orchestrator at {server} did not answer in time"
    else:
        detail = f"cannot talk to the orchestrator at {server}: {exc or type(exc).__name__}"
    return Unavailable(0, "unreachable", detail)


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def stream_timeout(connect_s: float, until: float | None) -> httpx2.Timeout:
    """A stream's timeouts: a read waits at most `READ_TIMEOUT_S` (keep-alives come every 15 s,
    so longer silence is a dead connection) and never past `until`."""
    read = READ_TIMEOUT_S if until is None else max(0.01, min(READ_TIMEOUT_S, until - time.monotonic()))
    return httpx2.Timeout(connect_s, read=read)


def past(until: float | None) -> bool:
    return until is not None and time.monotonic() >= until


def timed_out(task_id: str, timeout: float | None) -> WaitTimeout:
    return WaitTimeout(
        0, "wait_timeout", f"task {task_id} did not end within {timeout} s; it goes on (wait again, or cancel it)"
    )
