"""`/v1/agent/artifacts`: a device agent's side of artifacts, for its device token only.

A device publishes for the batch it runs and fetches the artifacts of that batch's task: every
route names the batch, and the batch must be the token's device's own and still open. API keys
and other devices' tokens are refused. These routes belong to the device protocol (like the
WebSocket at `/v1/agent`) and are documented in docs/how-to/artifacts.md, not in the OpenAPI document.

    POST  /uploads                {batch_id, name, size, sha256} -> 201 {id, state, offset, size, chunk_bytes}
    GET   /uploads/{id}           -> the same, `artifact` once complete
    PATCH /uploads/{id}           Upload-Offset: N, body: the next bytes (at most chunk_bytes) -> the same
    GET   ?batch_id=&name=&sha256= -> {name, version, sha256, size} (the newest match in the batch's task)
    GET   /{sha256}/content?batch_id= -> the bytes, streamed; Range resumes
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.api.artifacts import IfRange, RangeHeader, content_response
from orchestrator.api.deps import Comp, components
from orchestrator.api.errors import ApiError
from orchestrator.api.schemas import NO_NUL
from orchestrator.artifacts import records
from orchestrator.artifacts.errors import ArtifactNotFound, InvalidArtifact
from orchestrator.artifacts.model import SHA256_PATTERN, artifact_name, content_address
from orchestrator.domain.model import AdminState
from orchestrator.security import DEVICE_TOKEN_PREFIX, bearer
from orchestrator.store.models import Device

router = APIRouter(prefix="/v1/agent/artifacts", tags=["device agents"], include_in_schema=False)

BatchParam = Annotated[str, Query(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_-]+$")]


async def _device(request: Request) -> Device:
    """The device whose token the request carries (SPEC section 4's token, over HTTP)."""
    comp = components(request)
    token = bearer(request.headers.get("authorization"))
    if token is not None and not token.startswith(DEVICE_TOKEN_PREFIX + "_"):
        raise ApiError(403, "forbidden", "these routes are for device agents: send a device token, not an API key")
    device = await comp.store.find_device_by_token(comp.hasher.digest(token)) if token else None
    if device is None or device.admin_state == AdminState.REVOKED:
        client = request.client.host if request.client else "?"
        if not comp.auth_failures.allow(client):
            raise ApiError(429, "rate_limited", "too many failed authentications from this address; wait a minute")
        raise ApiError(401, "unauthorized", "a valid device token is required (Authorization: Bearer orrd_...)")
    return device


DeviceDep = Annotated[Device, Depends(_device)]


class UploadCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batch_id: Annotated[str, Field(min_length=1, max_length=40), NO_NUL]
    name: Annotated[str, Field(min_length=1, max_length=200), NO_NUL]
    size: int = Field(ge=0, le=2**62)
    sha256: Annotated[str, Field(pattern=SHA256_PATTERN)]


@router.post("/uploads", status_code=201)
async def open_upload(body: UploadCreate, comp: Comp, device: DeviceDep) -> JSONResponse:
    view = await comp.artifacts.uploads.open(device.id, body.batch_id, body.name, body.size, body.sha256)
    return JSONResponse(view.as_json(), status_code=201)


@router.get("/uploads/{upload_id}")
async def upload_status(upload_id: str, comp: Comp, device: DeviceDep) -> dict[str, Any]:
    return (await comp.artifacts.uploads.status(device.id, _upload_ref(upload_id))).as_json()


@router.patch("/uploads/{upload_id}")
async def send_piece(
    upload_id: str,
    request: Request,
    comp: Comp,
    device: DeviceDep,
    upload_offset: Annotated[int, Header(ge=0, le=2**62, description="where these bytes go")],
) -> dict[str, Any]:
    # The body is at most ORRERY_MAX_REQUEST_BYTES (the app's BodyLimit read it, counting), and
    # a piece is at most the upload's chunk_bytes: one piece in memory, never the whole file.
    data = await request.body()
    view = await comp.artifacts.uploads.receive(device.id, _upload_ref(upload_id), upload_offset, data)
    return view.as_json()


@router.get("")
async def lookup(
    comp: Comp,
    device: DeviceDep,
    batch_id: BatchParam,
    name: Annotated[str | None, Query(max_length=200)] = None,
    sha256: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """The newest artifact of the batch's task with this name and/or content."""
    task_id = (await records.open_batch(comp.store, device.id, batch_id, "fetch")).task_id
    if name is None and sha256 is None:
        raise InvalidArtifact("name an artifact: give name, sha256 or both")
    found = await records.newest(
        comp.store,
        task_id,
        artifact_name(name) if name is not None else None,
        content_address(sha256) if sha256 is not None else None,
    )
    if found is None:
        asked = " and ".join(x for x in (f"name {name!r}" if name else "", f"sha256 {sha256}" if sha256 else "") if x)
        raise ArtifactNotFound(
            f"task {task_id} has no artifact with {asked}; a node can fetch only what a command of the same task "
            "published before it (add an edge from the publishing node)"
        )
    return found.summary()


@router.get("/{sha256}/content")
async def content(
    sha256: str,
    comp: Comp,
    device: DeviceDep,
    batch_id: BatchParam,
    range_: RangeHeader = None,
    if_range: IfRange = None,
) -> Response:
    task_id = (await records.open_batch(comp.store, device.id, batch_id, "fetch")).task_id
    found = await records.newest(comp.store, task_id, None, content_address(sha256))
    if found is None:
        raise ArtifactNotFound(f"task {task_id} has no artifact with sha256 {sha256}")
    return await content_response(comp.artifacts, found, range_, if_range, None)


def _upload_ref(upload_id: str) -> str:
    if "\x00" in upload_id or len(upload_id) > 40:
        raise ArtifactNotFound(f"this device has no upload {upload_id[:40]!r}")
    return upload_id
