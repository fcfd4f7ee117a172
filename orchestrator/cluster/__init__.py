"""Where engine inputs and device frames go: one process (`LocalCluster`) or many replicas sharing
Postgres and Redis (`RedisCluster`). The API, gateway and engine only ever talk to a `Cluster`; the
cluster reaches this replica's device sockets only through `DeviceSockets` (the gateway is one),
so neither package imports the other."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.domain.model import DagSpec
from orchestrator.domain.problems import Problem
from orchestrator.engine.records import DeviceRun, Input, LinkReport, Route
from protocol.messages import Message

if TYPE_CHECKING:
    from orchestrator.engine.core import Engine


class ClusterUnavailable(Exception):
    """No engine answered a request within its deadline (the API answers 503 `cluster_unavailable`)."""


class DeviceSockets(Protocol):
    """What a cluster needs of this replica's device connections (the gateway)."""

    def send(self, device_id: str, message: Message, epoch: int = 0) -> bool:
        """Queue a frame on the device's session here if it belongs to connection `epoch` or a
        newer one: True if it may reach the device, False if it certainly cannot from here."""
        ...

    def close(self, device_id: str, code: int, reason: str) -> None: ...

    def link_report(self) -> LinkReport:
        """Every device link here, as the engine should know it."""
        ...


class Cluster(Protocol):
    replica_id: str

    @property
    def is_leader(self) -> bool: ...

    def submit(self, item: Input) -> asyncio.Future[Any]:
        """Hand an input to the engine; the future resolves once its changes are committed, or
        fails with `ClusterUnavailable` within the request deadline."""
        ...

    def notify(self, item: Input) -> None:
        """Hand an input to the engine without waiting (it may be lost across replicas: only
        for hints that are re-derived or re-sent anyway)."""
        ...

    def report(self, report: LinkReport) -> None: ...

    def send(self, device_id: str, message: Message, route: Route) -> bool: ...

    def close(self, device_id: str, code: int, reason: str, route: Route) -> None: ...

    async def validate(self, spec: DagSpec) -> list[Problem]: ...

    async def devices(self, fresh: bool = False) -> list[DeviceRun]:
        """The fleet as submission checks see it (catalogues, placement facts), a snapshot;
        `fresh`: with every device's busy flag as of now (a replica may keep the rest)."""
        ...

    def device_connected(self, device_id: str, epoch: int) -> None: ...

    def device_seen(self, device_id: str, epoch: int) -> None: ...

    def device_gone(self, device_id: str, epoch: int) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


class LocalCluster:
    """Everything in one process: the engine is always here, every device socket too."""

    replica_id = "local"

    def __init__(self, engine: Engine, gateway: DeviceSockets) -> None:
        self.engine = engine
        self.gateway = gateway
        engine.replica_id = self.replica_id

    @property
    def is_leader(self) -> bool:
        return True

    def submit(self, item: Input) -> asyncio.Future[Any]:
        return self.engine.submit(item)

    def notify(self, item: Input) -> None:
        self.engine.notify(item)

    def report(self, report: LinkReport) -> None:
        self.engine.notify(report)

    def send(self, device_id: str, message: Message, route: Route) -> bool:
        return self.gateway.send(device_id, message, route.epoch)

    def close(self, device_id: str, code: int, reason: str, route: Route) -> None:
        self.gateway.close(device_id, code, reason)

    async def validate(self, spec: DagSpec) -> list[Problem]:
        return self.engine.validate(spec)

    async def devices(self, fresh: bool = False) -> list[DeviceRun]:
        return list(self.engine.devices.values())

    def device_connected(self, device_id: str, epoch: int) -> None:
        pass

    def device_seen(self, device_id: str, epoch: int) -> None:
        pass

    def device_gone(self, device_id: str, epoch: int) -> None:
        pass

    async def start(self) -> None:
        await self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()

    def status(self) -> dict[str, Any]:
        return {"mode": "single", "leader": True}
