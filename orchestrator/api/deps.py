"""Shared dependencies: the component container and role-checked principals."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request

from orchestrator.api.errors import ApiError
from orchestrator.config import Settings
from orchestrator.domain.model import Role
from orchestrator.gateway.limits import RateLimiter
from orchestrator.security import DEVICE_TOKEN_PREFIX, Hasher, bearer
from orchestrator.store.repo import Store
from orchestrator.views.hub import ViewHub

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from orchestrator.artifacts.service import Artifacts
    from orchestrator.bus.local import LocalBus
    from orchestrator.cluster import Cluster
    from orchestrator.engine.core import Engine
    from orchestrator.gateway.hub import Gateway
    from orchestrator.planner.service import PlannerService


@dataclass
class Components:
    settings: Settings
    store: Store
    hasher: Hasher
    engine: Engine
    gateway: Gateway
    bus: LocalBus
    auth_failures: RateLimiter
    cluster: Cluster
    artifacts: Artifacts
    planner: PlannerService | None = None
    redis: Redis | None = None
    views: ViewHub = field(default_factory=ViewHub)


@dataclass(frozen=True)
class Principal:
    key_id: str
    role: Role

    @property
    def operator(self) -> str:
        """How a takeover, and the input sent through it, name this caller."""
        return f"an operator (key {self.key_id})" if self.key_id else "an operator"


def components(request: Request) -> Components:
    comp: Components = request.app.state.components
    return comp


Comp = Annotated[Components, Depends(components)]


def require(role: Role) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency that admits API keys whose role is at least `role` (SPEC section 3)."""

    async def _check(request: Request) -> Principal:
        comp = components(request)
        token = bearer(request.headers.get("authorization"))
        key = None
        if token is None:
            refusal = "send an API key as 'Authorization: Bearer <key>'"
        elif token.startswith(DEVICE_TOKEN_PREFIX + "_"):
            refusal = "a device token is not an API key; it only opens /v1/agent"
        else:
            key = await comp.store.find_api_key(comp.hasher.digest(token))
            refusal = "the API key is unknown or revoked"
        if key is None:
            # Only failures are throttled, per address: a valid key (unguessable) always gets in,
            # so a client with a revoked key cannot lock out everyone behind the same address.
            client = request.client.host if request.client else "?"
            if not comp.auth_failures.allow(client):
                raise ApiError(429, "rate_limited", "too many failed authentications from this address; wait a minute")
            raise ApiError(401, "unauthorized", refusal)
        key_id, key_role = key
        principal = Principal(key_id, Role(key_role))
        if not principal.role.allows(role):
            raise ApiError(403, "forbidden", f"this route needs the '{role.value}' role; the key has '{key_role}'")
        request.state.principal = principal
        return principal

    return _check


Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]


def page(items: list[Any], next_cursor: str | None) -> dict[str, Any]:
    return {"items": items, "next_cursor": next_cursor}
