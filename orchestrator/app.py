"""The FastAPI application: components wired once at start-up, torn down at shutdown."""

from __future__ import annotations

import asyncio
import gc
import html
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, WebSocket
from fastapi.openapi.docs import swagger_ui_default_parameters
from fastapi.responses import HTMLResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator import __version__, mcp_endpoint, web
from orchestrator.api import (
    agent_artifacts,
    approvals,
    artifacts,
    devices,
    errors,
    health,
    keys,
    schedules,
    tasks,
    views,
)
from orchestrator.api.deps import Components
from orchestrator.api.errors import problem_response
from orchestrator.artifacts.service import Artifacts
from orchestrator.bus.local import LocalBus
from orchestrator.bus.redis import RedisBus
from orchestrator.cluster import Cluster, LocalCluster
from orchestrator.cluster.replicas import RedisCluster, redis_client
from orchestrator.config import Settings
from orchestrator.domain.model import Role
from orchestrator.engine.core import Engine
from orchestrator.engine.records import Route
from orchestrator.engine.times import utc
from orchestrator.gateway.hub import Gateway
from orchestrator.gateway.limits import RateLimiter
from orchestrator.ids import new_id, new_secret
from orchestrator.security import API_KEY_PREFIX, Hasher, load_secret_key, write_private
from orchestrator.store.migrate import upgrade_async
from orchestrator.store.models import ApiKey
from orchestrator.store.repo import Store, WriteConflict
from orchestrator.views.hub import ViewHub
from orchestrator.views.relay import RedisRelay
from orrery.logs import context as log_context

log = logging.getLogger("orrery")


def create_app(settings: Settings, migrate: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        comp = await start_components(settings, migrate)
        app.state.components = comp
        try:
            async with mcp.manager.run():
                yield
        finally:
            await stop_components(comp)

    app = FastAPI(
        title="Orrery",
        version=__version__,
        description="Control plane for fleets of devices: multi-device DAGs over MCP tools.",
        lifespan=lifespan,
        docs_url=None,  # served below from local assets: /docs works without internet
        redoc_url=None,
    )
    errors.install(app)
    for module in (health, tasks, devices, views, keys, approvals):
        app.include_router(module.router)
    app.include_router(schedules.router)
    for router in (artifacts.router, artifacts.links, agent_artifacts.router):
        app.include_router(router)
    web.mount(app)
    install_docs(app)
    mcp = mcp_endpoint.install(app, settings)

    @app.websocket("/v1/agent")
    async def agent_socket(ws: WebSocket) -> None:
        comp: Components = ws.app.state.components
        await comp.gateway.serve(ws)

    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes, timeout_s=settings.body_timeout_s)
    app.add_middleware(RequestId)
    app.add_middleware(SecurityHeaders)  # outermost: every answer carries them, a 413 from BodyLimit too
    return app


SWAGGER_UI = "/ui/vendor/swagger-ui"
DOCS_JS = "/ui/docs"

_DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<link type="text/css" rel="stylesheet" href="{css}">
<link rel="icon" href="{icon}">
<title>{title}</title>
</head>
<body>
<div id="swagger-ui"></div>
<script id="swagger-config" type="application/json">{config}</script>
<script src="{bundle}"></script>
<script src="{start}"></script>
</body>
</html>
"""
_REDIRECT_PAGE = """<!doctype html>
<html lang="en-US">
<head><meta charset="utf-8"><title>Swagger UI: OAuth2 Redirect</title></head>
<body><script src="{script}"></script></body>
</html>
"""


def install_docs(app: FastAPI) -> None:
    """Swagger UI at `/docs` with its script, style and icon served by this server (the vendored
    swagger-ui-dist under orchestrator/web/static/vendor/), never from a CDN. FastAPI's page starts
    Swagger UI with an inline script, which the pages' Content-Security-Policy refuses: this one
    hands its settings over as JSON to a script file (orchestrator/web/static/docs/)."""
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"
    config = {
        "url": openapi_url,
        "oauth2RedirectUrl": redirect_url,
        # no validator badge fetched from swagger.io
        "parameters": {**swagger_ui_default_parameters, "validatorUrl": None},
    }
    page = _DOCS_PAGE.format(
        css=f"{SWAGGER_UI}/swagger-ui.css",
        icon=f"{SWAGGER_UI}/favicon-32x32.png",
        title=html.escape(f"{app.title} API"),
        config=json.dumps(config).replace("<", "\\u003c"),  # no `</script>` can end the block early
        bundle=f"{SWAGGER_UI}/swagger-ui-bundle.js",
        start=f"{DOCS_JS}/swagger-init.js",
    )
    redirect_page = _REDIRECT_PAGE.format(script=f"{DOCS_JS}/oauth2-redirect.js")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return HTMLResponse(redirect_page)


def tune_gc() -> None:
    """The engine keeps many small, long-lived objects; the default thresholds make the cyclic
    collector rescan them every few hundred allocations, which cost ~10% of a busy engine."""
    gc.set_threshold(50_000, 20, 20)


async def start_components(settings: Settings, migrate: bool) -> Components:
    tune_gc()
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    url = settings.resolved_database_url
    if migrate:
        await upgrade_async(url)
    store = Store(url)
    hasher = Hasher(load_secret_key(settings.secret_key, data_dir))
    await bootstrap_admin_key(store, hasher, data_dir, settings.admin_key)
    redis = None
    if settings.redis_url:
        redis = redis_client(settings.redis_url)
    bus = RedisBus(redis) if redis is not None else LocalBus()
    engine = Engine(settings, store, bus)
    engine.metrics.stop_gc_watch = engine.metrics.gc_pauses.watch()
    auth_failures = RateLimiter(settings.auth_failures_per_minute, 60.0)
    gateway = Gateway(settings, store, hasher, engine.metrics, auth_failures)
    planner = None
    if settings.llm_configured:
        # Imported only when used: the OpenAI client costs ~0.5 s of start-up, and a restarting
        # orchestrator should be back as fast as it can (recovery speed).
        from orchestrator.planner.service import PlannerService

        planner = PlannerService(settings, store, engine)
    engine.planner = planner
    # The wiring: the cluster sends through the gateway's sockets, the gateway hands frames to the
    # cluster, the engine reaches devices through the cluster. No one of them builds another.
    cluster: Cluster
    if redis is not None:
        assert isinstance(bus, RedisBus)
        await bus.start()
        cluster = RedisCluster(settings, store, engine, gateway, redis)
    else:
        cluster = LocalCluster(engine, gateway)
    view_hub = ViewHub()
    view_hub.bind(
        lambda device_id, frame: cluster.send(device_id, frame, Route(None, 0)),
        RedisRelay(redis, view_hub.deliver) if redis is not None else None,
    )
    gateway.bind(cluster, view_hub)
    engine.links = cluster
    await cluster.start()
    await gateway.start()
    return Components(
        settings=settings,
        store=store,
        hasher=hasher,
        engine=engine,
        gateway=gateway,
        bus=bus,
        auth_failures=auth_failures,
        planner=planner,
        cluster=cluster,
        artifacts=Artifacts.create(settings, store),
        redis=redis,
        views=view_hub,
    )


async def stop_components(comp: Components) -> None:
    comp.engine.metrics.stop_gc_watch()
    if comp.planner is not None:
        await comp.planner.close()
    await comp.gateway.stop()
    await comp.views.close()
    await comp.cluster.stop()
    await comp.bus.close()
    if comp.redis is not None:
        await comp.redis.aclose()
    await comp.store.close()


async def bootstrap_admin_key(store: Store, hasher: Hasher, data_dir: Path, given: str | None = None) -> None:
    """First start with an empty store: create an admin key (the configured one, for deployments
    that hand it out through a secret, else a fresh one) and write it to `<data-dir>/admin.key` (0600)."""
    if await store.count_api_keys() > 0:
        return
    key = given or new_secret(API_KEY_PREFIX)
    row = {
        "id": new_id("key"),
        "name": "bootstrap admin",
        "role": Role.ADMIN.value,
        "key_hash": hasher.digest(key),
        "created_at": utc(time.time()),
        "revoked_at": None,
    }
    try:
        await store.add(ApiKey, row)
    except WriteConflict:
        return  # another replica starting at the same moment created it
    path = data_dir / "admin.key"
    write_private(path, key + "\n")
    log.warning("created an admin API key; it is in %s (mode 0600)", path.resolve())


class RequestId:
    """A request id for every REST call: the caller's `X-Request-ID` if it sent a sane one, else a
    new one; echoed in the response and attached to every log line written while serving it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if given and len(given) <= 64 and given.replace("-", "").isalnum() else new_id("req")
        token = log_context.set({"request_id": request_id})

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log_context.reset(token)


# The pages (the dashboard, /docs): scripts and styles from this server only, no inline script and
# no eval; images from here, data: URLs (Swagger UI's icons) and blob: URLs (an approval's
# screenshot, fetched with the key); videos from blob: URLs (an attempt's screen recording,
# fetched with the key); fetch and server-sent events to this server only; never framed.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; media-src 'self' blob:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
# Everything else (JSON, images, artifacts' bytes), should a browser ever open it as a document:
# nothing loads, no script runs, it is not framed.
CONTENT_CSP = "default-src 'none'; frame-ancestors 'none'; sandbox"
_SCRIPTS_AND_STYLES = (b"text/javascript", b"application/javascript", b"text/css")


class SecurityHeaders:
    """Headers on every HTTP answer: `nosniff` (a body is only what its Content-Type says),
    `X-Frame-Options: DENY` and no Referer; a Content-Security-Policy on what has a body (the
    pages' `PAGE_CSP`, everything else `CONTENT_CSP`; a 304 gets none, since a browser would
    merge it into the cached page's headers); and bytes sent as `application/octet-stream`
    (artifacts) are `Content-Disposition: attachment`: downloaded, never shown on this origin."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = secured(list(message.get("headers", [])))
            await send(message)

        await self.app(scope, receive, send_with_headers)


def secured(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` with the security headers `SecurityHeaders` adds (those already set stay)."""
    present = {k.lower() for k, _ in headers}
    content_type = next((v.split(b";")[0].strip().lower() for k, v in headers if k.lower() == b"content-type"), b"")
    extra = [
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"no-referrer"),
        (b"cross-origin-resource-policy", b"same-origin"),
    ]
    if content_type == b"text/html":
        extra += [(b"content-security-policy", PAGE_CSP.encode()), (b"cross-origin-opener-policy", b"same-origin")]
    elif content_type and content_type not in _SCRIPTS_AND_STYLES:
        extra.append((b"content-security-policy", CONTENT_CSP.encode()))
    if content_type == b"application/octet-stream":
        extra.append((b"content-disposition", b"attachment"))
    return headers + [(k, v) for k, v in extra if k not in present]


class BodyLimit:
    """Read each request body before the app sees it, counting as it comes: over `max_bytes` is
    413 `payload_too_large` (a Content-Length over the limit before any of it is read, a chunked
    body as soon as it passes the limit), and a body not all there within `timeout_s` is 408
    `request_timeout`. Both answers close the connection, so the rest of the body is never read.

    Counting inside the app instead (wrapping `receive`) is not enough: FastAPI turns any error
    raised while it reads a body into 400 "error parsing the body"."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is None and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body
            return
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send, 413)
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(receive)
        except _TooLarge:
            await self._refuse(scope, receive, send, 413)
            return
        except TimeoutError:
            await self._refuse(scope, receive, send, 408)
            return
        if body is None:
            return  # the client went away; there is no one to answer
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # http.disconnect, when it comes

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        parts: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            part = message.get("body", b"")
            seen += len(part)
            if seen > self.max_bytes:
                raise _TooLarge
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int) -> None:
        if status == 413:
            response = problem_response(
                413, "payload_too_large", f"the request body is over the limit of {self.max_bytes} bytes"
            )
        else:
            response = problem_response(
                408, "request_timeout", f"the request body did not arrive within {self.timeout_s:g} s"
            )
        response.headers["connection"] = "close"
        await response(scope, receive, send)


class _TooLarge(Exception):
    pass


def describe(settings: Settings) -> dict[str, Any]:
    return {"host": settings.host, "port": settings.port, "data_dir": str(settings.data_dir)}
