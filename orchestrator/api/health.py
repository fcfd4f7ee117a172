"""Liveness and readiness probes (no auth)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from orchestrator import __version__
from orchestrator.api.deps import Comp

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=PlainTextResponse, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(comp: Comp) -> Response:
    """Prometheus metrics of this replica."""
    return Response(generate_latest(comp.engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
async def healthz() -> dict[str, Any]:
    return {"status": "ok", "version": __version__}


@router.get("/readyz", responses={503: {"description": "a dependency is not reachable"}})
async def readyz(comp: Comp) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        await comp.store.ping()
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    if comp.redis is not None:
        try:
            await comp.redis.ping()
            checks["redis"] = "ok"
        except Exception as exc:
            checks["redis"] = f"error: {type(exc).__name__}"
    engine = comp.engine
    if engine.failed:
        checks["engine"] = "failed"
    elif comp.cluster.is_leader:
        checks["engine"] = "ok" if engine.ready_event.is_set() else "starting"
    else:
        checks["engine"] = "ok"  # another replica leads; this one serves the API and devices
    ok = all(v == "ok" for v in checks.values())
    body = {"status": "ok" if ok else "unavailable", "checks": checks, "cluster": comp.cluster.status()}
    return JSONResponse(body, 200 if ok else 503)
