"""Where engine inputs and device frames go: one process (`LocalCluster`) or many replicas sharing
Postgres and Redis (`RedisCluster`). The API, gateway and engine only ever talk to a `Cluster`."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.domain.model import DagSpec
from orchestrator.domain.problems import Problem
from orchestrator.engine.records import Input
from protocol.messages import Message

if TYPE_CHECKING:
    from orchestrator.engine.core import Engine
    from orchestrator.gateway.hub import Gateway


class Cluster(Protocol):
    replica_id: str

    @property
    def is_leader(self) -> bool: ...

    def submit(self, item: Input) -> asyncio.Future[Any]: ...

    def notify(self, item: Input) -> None: ...

    def send(self, device_id: str, message: Message) -> bool: ...

    def close(self, device_id: str, code: int, reason: str) -> None: ...

    async def validate(self, spec: DagSpec) -> list[Problem]: ...

    def device_connected(self, device_id: str) -> None: ...

    def device_seen(self, device_id: str) -> None: ...

    def device_gone(self, device_id: str) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


class LocalCluster:
    """Everything in one process: the engine is always here, every device socket too."""

    replica_id = "local"

    def __init__(self, engine: Engine, gateway: Gateway) -> None:
        self.engine = engine
        self.gateway = gateway

    @property
    def is_leader(self) -> bool:
        return True

    def submit(self, item: Input) -> asyncio.Future[Any]:
        return self.engine.submit(item)

    def notify(self, item: Input) -> None:
        self.engine.notify(item)

    def send(self, device_id: str, message: Message) -> bool:
        return self.gateway.send(device_id, message)

    def close(self, device_id: str, code: int, reason: str) -> None:
        self.gateway.close(device_id, code, reason)

    async def validate(self, spec: DagSpec) -> list[Problem]:
        return self.engine.validate(spec)

    def device_connected(self, device_id: str) -> None:
        pass

    def device_seen(self, device_id: str) -> None:
        pass

    def device_gone(self, device_id: str) -> None:
        pass

    async def start(self) -> None:
        await self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()

    def status(self) -> dict[str, Any]:
        return {"mode": "single", "leader": True}
