"""The agent's HTTP(S) line to the orchestrator's artifact routes (`/v1/agent/artifacts`).

It uses what the agent's WebSocket uses: the server URLs (`--server`, then each `--also-server`
in turn after a failed or cut connection), the device token as `Authorization: Bearer`, and the CA
file for https. A request that fails for a reason that may pass (no connection, a timeout, a
dropped stream, 408, 429, 5xx: an orchestrator restarting or failing over) is tried again after
a capped exponential backoff with full jitter (`device_agent.reconnect.Backoff`) until the
call's deadline; any other refusal is final and raised as `Refused` with the server's problem.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2

from device_agent.reconnect import Backoff

log = logging.getLogger("orrery.agent.transfer")

ROUTES = "/v1/agent/artifacts"
REQUEST_TIMEOUT_S = 30.0  # one request (or one read of a stream) at most; the deadline may cut it
RETRIED_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class TransferError(Exception):
    """A transfer that failed for good: `code` is the tool's error code (SPEC section 4 and the
    artifact codes in protocol/errors.py), `str(exc)` the message for whoever acts next."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Refused(Exception):
    """The orchestrator answered with a final refusal (a problem document)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.code = str(problem.get("code") or "http_error")
        self.detail = str(problem.get("detail") or f"HTTP {status}")
        self.problem = problem
        super().__init__(f"{self.code}: {self.detail}")


class Transient(Exception):
    """A failure worth trying again (the orchestrator restarting, a cut connection)."""


def http_base(server: str) -> str:
    """An orchestrator URL as given to the agent (http(s) or ws(s), maybe ending in /v1/agent) as
    the base of its HTTP routes."""
    parts = urlsplit(server if "://" in server else f"http://{server}")
    scheme = {"ws": "http", "wss": "https", "http": "http", "https": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/").removesuffix("/v1/agent")
    return urlunsplit((scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True)
class ArtifactLink:
    """Everything the artifact tools need to reach the orchestrator as this device."""

    servers: tuple[str, ...]  # http(s) base URLs, in failover order
    token: str
    ca_file: Path | None
    max_bytes: int  # this device's own cap on an artifact it publishes or fetches

    def verify(self) -> ssl.SSLContext | bool:
        if self.ca_file is None:
            return True
        return ssl.create_default_context(cafile=str(self.ca_file))


class Connection:
    """One transfer's requests: retried with backoff until `deadline` (a `time.monotonic()`),
    moving to the next server URL after a connection failure."""

    def __init__(
        self,
        link: ArtifactLink,
        deadline: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.link = link
        self.deadline = deadline
        self.clock = clock
        self.sleep = sleep
        self.backoff = Backoff(clock=clock)
        self.retries = 0  # failures that were tried again (a resumed transfer has some)
        self._turn = 0
        self._client: httpx2.AsyncClient | None = None

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def left(self) -> float:
        return self.deadline - self.clock()

    def _http(self) -> httpx2.AsyncClient:
        if self._client is None:
            base = self.link.servers[self._turn % len(self.link.servers)]
            self._client = httpx2.AsyncClient(
                base_url=base,
                headers={"Authorization": f"Bearer {self.link.token}"},
                verify=self.link.verify(),
                timeout=httpx2.Timeout(REQUEST_TIMEOUT_S, connect=10.0),
            )
        return self._client

    async def call(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        """One JSON request, tried again on transient failures until the deadline."""
        while True:
            try:
                response = await self._http().request(method, ROUTES + path, timeout=self._timeout(), **kwargs)
                answer: dict[str, Any] = _checked(response, response.content).json()
                return answer
            except (Transient, httpx2.TransportError, ValueError) as exc:
                await self.pause(exc, what)

    @asynccontextmanager
    async def stream(self, path: str, **kwargs: Any) -> AsyncIterator[httpx2.Response]:
        """One streamed GET, checked (raises `Transient` or `Refused`); the caller reads it and
        calls `pause` itself on a transient failure, to resume from where it got."""
        try:
            async with self._http().stream("GET", ROUTES + path, timeout=self._timeout(), **kwargs) as response:
                if response.status_code >= 400:
                    _checked(response, await response.aread())
                yield response
        except httpx2.TransportError as exc:
            raise Transient(f"{type(exc).__name__}: {exc}") from exc

    async def pause(self, exc: BaseException, what: str) -> None:
        """Wait before trying again after `exc`, or raise `TransferError("timeout")` if the
        deadline leaves no time for another try."""
        self.retries += 1
        cut = exc.__cause__ if isinstance(exc, Transient) else exc
        if isinstance(cut, httpx2.TransportError) and len(self.link.servers) > 1:
            # The connection failed, not the server's answer: the next server URL, as the
            # WebSocket does after each failed connection (a killed replica, its proxy closing).
            self._turn += 1
            await self.__aexit__()
        delay = self.backoff.next_delay()
        if self.left() - delay < 0.5:
            raise TransferError(
                "timeout",
                f"{what}: the orchestrator could not be reached in time (last: {_reason(exc)}); "
                "the command ran out of time, so call it again (a publish resumes what was sent)",
            ) from None
        log.info("%s: %s; trying again in %.1fs", what, _reason(exc), delay)
        await self.sleep(delay)

    def _timeout(self) -> float:
        return max(0.5, min(REQUEST_TIMEOUT_S, self.left()))


def _checked(response: httpx2.Response, body: bytes) -> httpx2.Response:
    if response.status_code < 400:
        return response
    try:
        problem = json.loads(body) if body else {}
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    if response.status_code in RETRIED_STATUS:
        raise Transient(f"HTTP {response.status_code} {problem.get('code') or ''}".strip())
    raise Refused(response.status_code, problem)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
