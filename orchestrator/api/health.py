"""Liveness and readiness probes (no auth)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from orchestrator import __version__
from orchestrator.api.deps import Comp

router = APIRouter(tags=["health"])


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
    engine = comp.engine
    checks["engine"] = "failed" if engine.failed else ("ok" if engine.ready_event.is_set() else "starting")
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks}, 200 if ok else 503)
