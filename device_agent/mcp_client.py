"""How the agent's MCP client meets a third-party server: a streamable-HTTP target whose secret
headers go to its own origin only, what the client offers the server (roots, elicitation; no
sampling), and a one-line account of why a connection failed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitRequestParams, ElicitResult, ListRootsResult, Root
from pydantic import FileUrl

log = logging.getLogger("orrery.agent.router")


class OriginBoundHeaders:
    """Puts the configured headers (the bearer token) on requests for the configured origin only.

    It runs as the HTTP client's request hook, so it sees every request, redirects included:
    whatever sends a request elsewhere (a redirect followed by anyone, a URL a server hands back),
    the headers are taken off it first. As the response hook it remembers the server's last
    refusal (401/403), so a failure to connect can say that the credentials were refused."""

    def __init__(self, url: str, headers: tuple[tuple[str, str], ...]) -> None:
        self.origin = _origin(httpx2.URL(url))
        self.headers = headers
        self.refused: str | None = None

    async def on_request(self, request: httpx2.Request) -> None:
        ours = self.covers(request.url)
        for name, value in self.headers:
            if ours:
                request.headers[name] = value
            elif name in request.headers:
                del request.headers[name]
        # An OAuth bearer token is put on the MCP server's requests only; whatever else carries one
        # elsewhere loses it (the authorization server's requests carry none, or Basic client auth).
        if not ours and request.headers.get("authorization", "").lower().startswith("bearer "):
            del request.headers["authorization"]

    async def on_response(self, response: httpx2.Response) -> None:
        if not self.covers(response.request.url):
            return
        if response.status_code in (401, 403):
            self.refused = f"{response.status_code} {response.reason_phrase}".strip()
        elif response.status_code < 400:
            self.refused = None

    def covers(self, url: httpx2.URL) -> bool:
        """Same scheme, host and port; or the https upgrade of an http origin on default ports."""
        origin = _origin(url)
        if origin == self.origin:
            return True
        scheme, host, port = self.origin
        return (scheme, port) == ("http", 80) and origin == ("https", host, 443)


def _origin(url: httpx2.URL) -> tuple[str, str, int | None]:
    scheme = url.scheme.lower()
    return scheme, (url.host or "").lower(), url.port or {"http": 80, "https": 443}.get(scheme)


def public_url(url: str) -> str:
    """A URL for messages and reports: no userinfo, query or fragment (they can carry secrets)."""
    return str(httpx2.URL(url).copy_with(userinfo=b"", query=None, fragment=None))


@dataclass(frozen=True)
class HttpTarget:
    """A third-party MCP server over streamable HTTP, with optional headers (a bearer token) or
    OAuth (`auth`: the SDK's provider, which gets the bearer token; `secrets`: what it holds now).

    The headers never appear in `repr` and are sent only to the URL's origin (OriginBoundHeaders)."""

    url: str
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    auth: httpx2.Auth | None = field(default=None, repr=False, compare=False)
    secrets: Callable[[], list[str]] = field(default=list, repr=False, compare=False)

    def client(self) -> tuple[httpx2.AsyncClient, OriginBoundHeaders]:
        bound = OriginBoundHeaders(self.url, self.headers)
        hooks: dict[str, list[Callable[..., Any]]] = {"request": [bound.on_request], "response": [bound.on_response]}
        timeout = httpx2.Timeout(30, read=300)
        return httpx2.AsyncClient(auth=self.auth, event_hooks=hooks, timeout=timeout), bound

    def transport(self, client: httpx2.AsyncClient) -> Any:
        return streamable_http_client(self.url, http_client=client)

    def redact(self, text: str) -> str:
        """`text` without any configured header value or OAuth token or client secret (a server may
        echo the token in an error)."""
        for value in [*(v for _, v in self.headers), *self.secrets()]:
            for secret in {value, value.partition(" ")[2]} - {""}:
                if len(secret) >= 4:
                    text = text.replace(secret, "[redacted]")
        return text


@dataclass(frozen=True)
class ClientFeatures:
    """The MCP client capabilities the agent declares to a third-party server.

    - roots: declared with `roots` (the workspace unless the owner configured others), as
      file:// URIs; no roots (`roots = []` in the config) declares no roots capability.
    - elicitation: declared, and always declined: no person watches the device during a task,
      and a server that asks before it acts (a confirmation) must get a clear "no", not a hang
      or silence it could take for consent.
    - sampling: not declared. The device has no model of its own, and lending the planner's
      model to any server the device runs would let that server spend the fleet's model budget
      and see what it answers. Servers hide tools that need it; one that asks anyway gets the
      SDK's immediate "Sampling not supported" error.
    """

    roots: tuple[Path, ...] = ()

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"elicitation_callback": _decline_elicitation}
        if self.roots:
            listing = ListRootsResult(roots=[Root(uri=FileUrl(r.as_uri()), name=r.name or str(r)) for r in self.roots])

            async def list_roots(context: ClientRequestContext) -> ListRootsResult:
                return listing

            options["list_roots_callback"] = list_roots
        return options


async def _decline_elicitation(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    log.info("declined an MCP server's request for input (no person answers on a device): %.200s", params.message)
    return ElicitResult(action="decline")


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, the way anyio task groups wrap them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def describe_failure(exc: BaseException, target: Any, auth: OriginBoundHeaders | None) -> str:
    """Why a toolset could not start or died, in words an owner can act on (no secrets)."""
    if isinstance(target, HttpTarget) and auth is not None and auth.refused is not None:
        what = "the OAuth access token" if target.auth is not None else "the configured bearer_token/headers"
        return (
            f"the MCP server at {public_url(target.url)} answered {auth.refused}: "
            f"it refused {what} (wrong, expired or missing)"
        )
    text = "; ".join(dict.fromkeys(str(e) or type(e).__name__ for e in _leaves(exc)))
    if isinstance(target, HttpTarget):
        text = f"{target.redact(text)} (MCP server at {public_url(target.url)})"
    return text
