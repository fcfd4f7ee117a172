"""The web dashboard: static files served by `orrery serve` at `/` (no build step at run time)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"


def mount(app: FastAPI) -> None:
    """Serve the dashboard: `/` is the single page, `/ui/...` its assets."""
    app.mount("/ui", StaticFiles(directory=STATIC), name="ui")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})
