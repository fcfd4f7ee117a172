"""The orchestrator's MCP server at `/mcp` (Streamable HTTP), for AI assistants.

The tools are `orrery.mcp_server`'s, over the REST API through the SDK in process (an httpx2
ASGI transport into this very app), with the request's own API key: each tool call is a REST
request that key makes, checked and refused as the REST API checks it (SPEC section 3, roles).
A request without a valid key gets the API's own 401 problem before the MCP layer sees it.

Stateless: every request stands alone (no MCP session kept here), so any replica answers any
request and a load balancer needs no affinity. The Host header must name a loopback address or
one of `mcp_allowed_hosts`, and a browser's Origin a loopback one or one of
`mcp_allowed_origins` (DNS rebinding: a page elsewhere cannot reach a local server through a
name it controls).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
from fastapi import FastAPI, Request
from mcp.server.mcpserver import Context
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Receive, Scope, Send

from orchestrator import __version__
from orchestrator.api.deps import require
from orchestrator.api.errors import ApiError, problem_response
from orchestrator.config import Settings
from orchestrator.domain.model import Role
from orchestrator.security import bearer
from orrery.mcp_server import build_server
from orrery.sdk import AsyncClient, Unauthorized

PATH = "/mcp"
LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"]
LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
IN_PROCESS = "http://orrery.in-process"  # the SDK's base URL over the ASGI transport (never resolved)


class McpEndpoint:
    """An ASGI endpoint: the API key checked, then the MCP request handled."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        self._app = app
        self.server = build_server(self._client_for, version=__version__)
        self.server.streamable_http_app(  # makes the session manager (its Starlette app is not used)
            streamable_http_path=PATH,
            stateless_http=True,
            transport_security=security(settings),
            max_request_body_size=settings.max_request_bytes,
        )
        self.manager: StreamableHTTPSessionManager = self.server.session_manager

    @asynccontextmanager
    async def _client_for(self, ctx: Context) -> AsyncIterator[AsyncClient]:
        key = bearer((ctx.headers or {}).get("authorization"))
        if not key:  # checked before the MCP layer ran; never fall back to another key (the SDK's default)
            raise Unauthorized(401, "unauthorized", "send an API key as 'Authorization: Bearer <key>'")
        transport = httpx2.ASGITransport(app=self._app)
        async with AsyncClient(IN_PROCESS, key, transport=transport) as client:
            yield client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await require(Role.VIEWER)(Request(scope))
        except ApiError as exc:
            response = problem_response(exc.status, exc.code, exc.detail, **exc.extra)
            await response(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)


def security(settings: Settings) -> TransportSecuritySettings:
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=LOOPBACK_HOSTS + _listed(settings.mcp_allowed_hosts),
        allowed_origins=LOOPBACK_ORIGINS + _listed(settings.mcp_allowed_origins),
    )


def _listed(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def install(app: FastAPI, settings: Settings) -> McpEndpoint:
    endpoint = McpEndpoint(app, settings)
    # an ASGI app (Starlette calls it with scope, receive, send), not a request handler
    app.add_route(PATH, endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)  # type: ignore[arg-type]
    return endpoint
