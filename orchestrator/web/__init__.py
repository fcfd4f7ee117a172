"""The web dashboard: static files served by `orrery serve` at `/` (no build step at run time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

STATIC = Path(__file__).parent / "static"


class _Revalidated(StaticFiles):
    """Static files a browser must revalidate (ETag), so an upgrade never runs stale modules."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        return response


def mount(app: FastAPI) -> None:
    """Serve the dashboard: `/` is the single page, `/ui/...` its assets."""
    app.mount("/ui", _Revalidated(directory=STATIC), name="ui")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})
