"""`/v1/tasks/{id}/artifacts`: what a task's commands published, and their content.

Every `{task_id}` is an id, a unique id prefix or the task's name. Content is streamed with
`Content-Length`, `ETag` (the sha256) and single `Range` requests. The dashboard asks for a
short-lived link (`POST .../link`) that the browser can follow without the API key.
"""

from __future__ import annotations

import logging
import mimetypes
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Header, Path, Query, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from orchestrator.api.deps import Comp, Viewer
from orchestrator.api.errors import COMMON, LISTING, problems
from orchestrator.api.lookup import check_ref, find_task
from orchestrator.api.schemas import Page
from orchestrator.artifacts import records
from orchestrator.artifacts.errors import ArtifactError, ArtifactNotFound, LinkExpired
from orchestrator.artifacts.links import make_link, read_link
from orchestrator.artifacts.model import ArtifactRecord
from orchestrator.artifacts.ranges import byte_range, etag
from orchestrator.artifacts.service import Artifacts
from orchestrator.engine.times import utc

log = logging.getLogger("orrery.api")

router = APIRouter(prefix="/v1/tasks", tags=["artifacts"], responses={**COMMON, **problems(404, 409)})
# Outside /v1: every /v1 route takes an API key, and a link is its own permission.
links = APIRouter(prefix="/artifact-links", tags=["artifacts"])

_BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_CONTENT_HEADERS = {
    "Content-Length": {"schema": {"type": "integer"}, "description": "bytes in this response"},
    "ETag": {"schema": {"type": "string"}, "description": "the content's sha256, quoted"},
    "Accept-Ranges": {"schema": {"type": "string"}, "description": "bytes"},
}
CONTENT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": _BINARY, "headers": _CONTENT_HEADERS, "description": "the whole content"},
    206: {
        "content": _BINARY,
        "headers": {**_CONTENT_HEADERS, "Content-Range": {"schema": {"type": "string"}}},
        "description": "the one range asked for (`Range: bytes=START-[END]`)",
    },
    304: {"description": "`If-None-Match` names this content's ETag"},
    **problems(416, s416="`range_not_satisfiable`: the range starts past the end (`content_range` has the size)"),
}
Version = Annotated[int | None, Query(ge=1, le=2**31 - 1, description="this version (default: the newest)")]
RangeHeader = Annotated[
    str | None, Header(alias="range", max_length=200, description="one `bytes=` range, to resume or to peek")
]
IfRange = Annotated[str | None, Header(max_length=200, description="send the range only if the ETag is still this")]
IfNoneMatch = Annotated[str | None, Header(max_length=200, description="an ETag held already: 304 if unchanged")]


class ArtifactOut(BaseModel):
    id: str
    task_id: str
    name: str
    version: int = Field(description="1 for the first publication of this name in the task, then 2, 3, ...")
    current: bool = Field(description="the newest version of its name (the one a fetch by name gets)")
    sha256: str
    size: int
    node_id: str = Field(description="the node whose command published it")
    device_id: str
    batch_id: str
    created_at: str
    content_url: str = Field(description="GET it (with the API key) for the bytes")
    content_type: str = Field(
        default="application/octet-stream",
        description="what its name says it is (`video/webm` for a screen recording); the bytes are always "
        "served as a download",
    )


class LinkOut(BaseModel):
    url: str = Field(description="GET it without an API key, until `expires_at`")
    expires_at: str
    artifact: ArtifactOut


def artifact_out(a: ArtifactRecord, current: bool) -> ArtifactOut:
    return ArtifactOut(
        id=a.id,
        task_id=a.task_id,
        name=a.name,
        version=a.version,
        current=current,
        sha256=a.sha256,
        size=a.size,
        node_id=a.node_id,
        device_id=a.device_id,
        batch_id=a.batch_id,
        created_at=a.created_at.isoformat(),
        content_type=mimetypes.guess_type(a.name, strict=False)[0] or "application/octet-stream",
        content_url=f"/v1/tasks/{a.task_id}/artifacts/{a.name}/content?version={a.version}",
    )


@router.get("/{task_id}/artifacts", response_model=Page, responses=LISTING)
async def list_artifacts(
    task_id: str,
    comp: Comp,
    _p: Viewer,
    history: Annotated[bool, Query(description="every version, not only each name's newest")] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Page:
    """The task's artifacts, newest first: each name's newest version, or with `history` all."""
    task = await find_task(comp.store, task_id)
    rows, nxt = await records.page(comp.store, task.id, history, limit, cursor)
    return Page(items=[artifact_out(a, current) for a, current in rows], next_cursor=nxt)


async def _find(comp: Comp, task_id: str, name: str, version: int | None) -> tuple[ArtifactRecord, bool]:
    task = await find_task(comp.store, task_id)
    check_ref("artifact", name)
    newest = await records.newest(comp.store, task.id, name)
    found = newest if version is None else await records.newest(comp.store, task.id, name, version=version)
    if found is None or newest is None:
        which = f"version {version} of " if version is not None and newest is not None else ""
        raise ArtifactNotFound(
            f"task {task.id} has no {which}artifact {name!r}; list them with GET /v1/tasks/{task.id}/artifacts"
        )
    return found, found.id == newest.id


@router.get("/{task_id}/artifacts/{name}", response_model=ArtifactOut)
async def get_artifact(task_id: str, name: str, comp: Comp, _p: Viewer, version: Version = None) -> ArtifactOut:
    """One artifact: its newest version, or `version`."""
    return artifact_out(*await _find(comp, task_id, name, version))


@router.get("/{task_id}/artifacts/{name}/content", response_class=Response, responses=CONTENT_RESPONSES)
async def artifact_content(
    task_id: str,
    name: str,
    comp: Comp,
    _p: Viewer,
    version: Version = None,
    range_: RangeHeader = None,
    if_range: IfRange = None,
    if_none_match: IfNoneMatch = None,
) -> Response:
    """The artifact's bytes (its newest version, or `version`), streamed; `Range` resumes."""
    found, _ = await _find(comp, task_id, name, version)
    return await content_response(comp.artifacts, found, range_, if_range, if_none_match)


@router.post("/{task_id}/artifacts/{name}/link", response_model=LinkOut)
async def artifact_link(task_id: str, name: str, comp: Comp, principal: Viewer, version: Version = None) -> LinkOut:
    """A download link for this version that needs no API key, valid for a few minutes: for a
    browser, which cannot send the key as a header when it follows a link."""
    found, current = await _find(comp, task_id, name, version)
    token, claims = make_link(comp.hasher, found.task_id, found.id, principal.key_id, time.time())
    return LinkOut(
        url=f"/artifact-links/{token}",
        expires_at=utc(float(claims.expires)).isoformat(),
        artifact=artifact_out(found, current),
    )


@links.get(
    "/{token}",
    response_class=Response,
    responses={**CONTENT_RESPONSES, **problems(400, 404, 410, 422, s410="`link_expired`: ask for a new link")},
)
async def follow_link(
    token: Annotated[str, Path(max_length=1000)],
    comp: Comp,
    range_: RangeHeader = None,
    if_range: IfRange = None,
) -> Response:
    """The bytes a download link names, as an attachment (no API key: the link is the permission)."""
    claims = read_link(comp.hasher, token, time.time())
    if not await comp.store.api_key_active(claims.key_id):
        raise LinkExpired("the API key that made this link has been revoked; sign in again and ask for a new one")
    found = await records.by_id(comp.store, claims.task_id, claims.artifact_id)
    if found is None:
        raise ArtifactNotFound("the artifact this link names is gone")
    return await content_response(comp.artifacts, found, range_, if_range, None, attachment=True)


async def content_response(
    artifacts: Artifacts,
    artifact: ArtifactRecord,
    range_header: str | None,
    if_range: str | None,
    if_none_match: str | None,
    attachment: bool = False,
) -> Response:
    """A streamed answer with the artifact's bytes (or the one range asked for)."""
    tag = etag(artifact.sha256)
    headers = {"ETag": tag, "Accept-Ranges": "bytes", "Cache-Control": "private, no-cache"}
    if attachment:
        headers["Content-Disposition"] = (
            f"attachment; filename=\"{_header_safe(artifact.name)}\"; filename*=UTF-8''{quote(artifact.name)}"
        )
    if if_none_match is not None and tag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers=headers)
    span = byte_range(range_header, artifact.size, if_range, tag)
    if not await artifacts.blobs.has(artifact.sha256):
        raise ArtifactNotFound(f"the bytes of artifact {artifact.name!r} are missing from the artifact store")
    headers["Content-Length"] = str(span.length)
    if span.partial:
        headers["Content-Range"] = span.content_range(artifact.size)
    return StreamingResponse(
        _guarded(artifacts.content(artifact, span), artifact),
        status_code=206 if span.partial else 200,
        media_type="application/octet-stream",
        headers=headers,
    )


def _header_safe(name: str) -> str:
    """The name for a quoted header parameter: a name recorded before names were checked whole
    (one ending in a newline) must not break the response's headers."""
    return "".join(c if " " <= c < "\x7f" and c not in '"\\' else "_" for c in name)


async def _guarded(pieces: AsyncIterator[bytes], artifact: ArtifactRecord) -> AsyncIterator[bytes]:
    """The pieces; a store failure midway ends the stream short (the client sees fewer bytes
    than `Content-Length` and retries with a Range) with a log line, not a stack trace."""
    try:
        async for piece in pieces:
            yield piece
    except (ArtifactError, OSError) as exc:
        log.warning("artifact %s (%s) could not be read to the end: %s", artifact.id, artifact.sha256, exc)
