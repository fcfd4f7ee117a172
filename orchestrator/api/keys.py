"""`/v1/api-keys`: create, list and revoke API keys (admin only; a key is shown once, stored hashed)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel
from sqlalchemy import select

from orchestrator.api.deps import Admin, Comp, Viewer
from orchestrator.api.errors import COMMON, ApiError, problems
from orchestrator.api.lookup import check_ref
from orchestrator.api.schemas import ApiKeyCreate, ApiKeyCreated, Page
from orchestrator.domain.model import Role
from orchestrator.engine.times import utc
from orchestrator.ids import new_id, new_secret
from orchestrator.security import API_KEY_PREFIX
from orchestrator.store.models import ApiKey
from orchestrator.store.repo import decode_cursor, encode_cursor

router = APIRouter(prefix="/v1/api-keys", tags=["api-keys"], responses={**COMMON, **problems(404, 409)})


@router.post("", status_code=201, response_model=ApiKeyCreated)
async def create(body: ApiKeyCreate, comp: Comp, _p: Admin) -> ApiKeyCreated:
    key = new_secret(API_KEY_PREFIX)
    key_id = new_id("key")
    await comp.store.add(
        ApiKey,
        {
            "id": key_id,
            "name": body.name,
            "role": body.role.value,
            "key_hash": comp.hasher.digest(key),
            "created_at": utc(time.time()),
            "revoked_at": None,
        },
    )
    return ApiKeyCreated(id=key_id, role=body.role, key=key, name=body.name)


class ApiKeyOut(BaseModel):
    id: str
    name: str
    role: Role
    created_at: str
    revoked_at: str | None = None


@router.get("", response_model=Page, responses=problems(400))
async def list_keys(
    comp: Comp,
    _p: Admin,
    revoked: Annotated[bool, Query(description="include revoked keys")] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Page:
    """API keys, oldest first (never the secret: it is shown once, at creation); `next_cursor`
    pages on."""
    q = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id).limit(limit + 1)
    if not revoked:
        q = q.where(ApiKey.revoked_at.is_(None))
    if cursor:
        at, last = decode_cursor(cursor)
        q = q.where((ApiKey.created_at > at) | ((ApiKey.created_at == at) & (ApiKey.id > last)))
    async with comp.store.sessions() as s:
        rows = list((await s.execute(q)).scalars())
    nxt = encode_cursor(rows[limit - 1].created_at, rows[limit - 1].id) if len(rows) > limit else None
    items = [
        ApiKeyOut(
            id=r.id,
            name=r.name or "",
            role=Role(r.role),
            created_at=r.created_at.isoformat(),
            revoked_at=r.revoked_at.isoformat() if r.revoked_at else None,
        )
        for r in rows[:limit]
    ]
    return Page(items=items, next_cursor=nxt)


@router.get("/me")
async def whoami(principal: Viewer) -> dict[str, Any]:
    """The key in use: its id and role (so a UI can offer only what the role allows)."""
    return {"id": principal.key_id, "role": principal.role.value}


@router.delete("/{key_id}")
async def revoke(key_id: str, comp: Comp, principal: Admin) -> dict[str, Any]:
    if key_id == principal.key_id:
        raise ApiError(409, "conflict", "an admin key cannot revoke itself; use another admin key")
    check_ref("API key", key_id)
    if not await comp.store.revoke_api_key(key_id, utc(time.time())):
        raise ApiError(404, "not_found", f"no active API key '{key_id}'")
    return {"id": key_id, "revoked": True}
