"""`/v1/api-keys`: create and revoke API keys (admin only; shown once, stored hashed)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from orchestrator.api.deps import Admin, Comp, Viewer
from orchestrator.api.errors import COMMON, ApiError, problems
from orchestrator.api.lookup import check_ref
from orchestrator.api.schemas import ApiKeyCreate, ApiKeyCreated
from orchestrator.engine.times import utc
from orchestrator.ids import new_id, new_secret
from orchestrator.security import API_KEY_PREFIX
from orchestrator.store.models import ApiKey

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
