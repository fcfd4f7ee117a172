"""The real engine in-process on a virtual clock: a real SQLite store, no sockets.

The test plays the gateways and the devices: it hands the engine the inputs a replica would
(hellos with their connection epoch, link reports, frames) and reads what the engine sent back
through `links`. Each `step` is one engine step, exactly as its loop runs it, so the order of
events is the test's to choose (no polling, no sleeps, no machine-speed dependence).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.bus.local import LocalBus
from orchestrator.config import Settings
from orchestrator.domain.controls import ControlAction
from orchestrator.domain.model import DagSpec, Liveness
from orchestrator.engine.core import Engine
from orchestrator.engine.records import (
    ControlDevice,
    DeviceChanged,
    DeviceHello,
    FrameIn,
    Input,
    LinkReport,
    LinkState,
    Route,
    TaskCreated,
)
from orchestrator.engine.times import utc
from orchestrator.store.migrate import upgrade
from orchestrator.store.models import Device, Edge, Node, Task
from orchestrator.store.repo import ChangeSet, Store
from orchestrator.store.rows import node_rows
from protocol.messages import (
    BatchAccepted,
    CommandBatch,
    Hello,
    Message,
    Result,
    ResultBatch,
    ToolAnnotations,
    ToolSpec,
)

T0 = 1_800_000_000.0


def tool(name: str, read_only: bool = False, idempotent: bool = False) -> ToolSpec:
    return ToolSpec(
        name=name,
        namespace=name.split(".", 1)[0],
        annotations=ToolAnnotations(read_only=read_only, idempotent=idempotent, destructive=not read_only),
    )


TOOLS = [tool("sim.act"), tool("sim.look", read_only=True)]


@dataclass
class Sent:
    device_id: str
    message: Message
    route: Route


@dataclass
class Links:
    """Stands in for the gateways: records every frame the engine sends."""

    sent: list[Sent] = field(default_factory=list)
    closed: list[tuple[str, int]] = field(default_factory=list)
    reachable: bool = True  # False: no session holds the device (the frame certainly cannot arrive)

    def send(self, device_id: str, message: Message, route: Route) -> bool:
        self.sent.append(Sent(device_id, message, route))
        return self.reachable

    def close(self, device_id: str, code: int, reason: str, route: Route) -> None:
        self.closed.append((device_id, code))


@dataclass
class Planner:
    """Records what the engine asks of the planner; the test decides what the planner answers."""

    replans: list[tuple[str, str]] = field(default_factory=list)
    plans: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)  # agent attempt ids whose loop was started

    def start_agent(
        self, attempt_id: str, task_id: str, node_id: str, instruction: str, max_steps: int, device: dict[str, Any]
    ) -> None:
        self.agents.append(attempt_id)

    def cancel_agent(self, attempt_id: str) -> None:
        pass

    def replan(self, task_id: str, node_id: str, context: dict[str, Any]) -> None:
        self.replans.append((task_id, node_id))

    def start_planning(self, task_id: str, request: str) -> None:
        self.plans.append(task_id)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


_TEMPLATE: dict[str, bytes] = {}


def _migrated_database(path: Path) -> None:
    """A freshly migrated SQLite file at `path` (migrated once per session, then copied)."""
    if "db" not in _TEMPLATE:
        template = path.with_name("template.db")
        upgrade(f"sqlite+aiosqlite:///{template}")
        _TEMPLATE["db"] = template.read_bytes()
    path.write_bytes(_TEMPLATE["db"])


class Harness:
    def __init__(self, tmp: Path, **settings: Any) -> None:
        path = tmp / "engine.db"
        _migrated_database(path)
        self.tmp = tmp
        self.url = f"sqlite+aiosqlite:///{path}"
        self.settings = Settings(data_dir=tmp, **{"heartbeat_interval_s": 1.0, "heartbeat_timeout_s": 5.0, **settings})
        self.clock = Clock()
        self.links = Links()
        self.planner: Planner | None = None
        self.fatal: list[BaseException] = []
        self.store = Store(self.url)
        self.engine = self._engine()
        self._ids = itertools.count(1)

    def _engine(self) -> Engine:
        engine = Engine(self.settings, self.store, LocalBus(), clock=self.clock, rng=lambda: 0.5)
        engine.links = self.links
        engine.planner = self.planner
        engine.on_fatal = self.fatal.append
        return engine

    async def open(self, planner: bool = False) -> Harness:
        if planner:
            self.planner = Planner()
            self.engine.planner = self.planner
        await self.engine.recover()
        return self

    async def restart(self) -> None:
        """A new engine on the same store, as after `kill -9` and a restart."""
        await self.store.close()
        self.store = Store(self.url)
        self.engine = self._engine()
        await self.engine.recover()

    async def close(self) -> None:
        await self.store.close()

    # ------------------------------------------------------------------ driving

    async def step(self, *items: Input) -> list[Any]:
        """One engine step over `items`; their replies (exceptions raise)."""
        loop = asyncio.get_running_loop()
        futures = []
        for item in items:
            item.done = loop.create_future()
            futures.append(item.done)
        await self.engine.step(list(items))
        return [f.result() for f in futures]

    async def advance(self, seconds: float) -> None:
        """Let virtual time pass, then run a step (timers fire, reconciles run)."""
        self.clock.now += seconds
        await self.engine.step([])

    async def live(self, seconds: float, replica: str, *links: tuple[str, int, Liveness, float, str | None]) -> None:
        """Let `seconds` pass while `replica` keeps reporting `links` every report interval, as a
        healthy replica does."""
        end = self.clock.now + seconds
        step = self.settings.link_report_interval_s
        while self.clock.now < end:
            await self.step(self.report(replica, *links))
            await self.advance(min(step, end - self.clock.now))

    # ------------------------------------------------------------------ fleet and tasks

    async def enroll(self, name: str, labels: dict[str, str] | None = None) -> str:
        device_id = f"dev_{name}"
        await self.store.add(
            Device,
            {
                "id": device_id,
                "name": name,
                "token_hash": f"h-{name}",
                "created_at": utc(self.clock.now),
                "labels": labels or {},
            },
        )
        await self.step(DeviceChanged(device_id))
        return device_id

    async def control(self, device_id: str, action: str, reason: str = "", **kw: Any) -> dict[str, Any]:
        """An operator's control of the device (drain, cordon, stop, ...), as the API asks it."""
        (reply,) = await self.step(ControlDevice(device_id, ControlAction(action), reason, **kw))
        assert isinstance(reply, dict)
        return reply

    def hello_frame(self, device_id: str, fence_seen: int = 0, tools: list[ToolSpec] | None = None) -> Hello:
        return Hello(
            device_id=device_id,
            versions=[1],
            info={"platform": "linux"},  # type: ignore[arg-type]
            tools=tools or TOOLS,
            fence_seen=fence_seen,
        )

    async def connect(
        self, device_id: str, replica: str = "A", resumed: bool = False, fence_seen: int = 0
    ) -> tuple[bool, int]:
        """A new connection of the device on `replica`: the next epoch from the store, then hello."""
        epoch = await self.store.open_session(device_id)
        (current,) = await self.step(
            DeviceHello(device_id, self.hello_frame(device_id, fence_seen), resumed, epoch, replica)
        )
        return current, epoch

    def report(self, replica: str, *links: tuple[str, int, Liveness, float, str | None]) -> LinkReport:
        return LinkReport(replica, [LinkState(*link) for link in links])

    async def submit(self, dag: dict[str, Any], notify: bool = True, replan: bool = False) -> str:
        """Store a task the way the API does; hand it to the engine unless the hint is 'lost'."""
        spec = DagSpec.model_validate(dag)
        task_id = f"task_{next(self._ids)}"
        changes = ChangeSet()
        changes.insert(
            Task,
            {
                "id": task_id,
                "name": task_id,
                "state": "running",
                "priority": 0,
                "labels": {},
                "replan": replan,
                "body_hash": hashlib.sha256(task_id.encode()).hexdigest(),
                "created_at": utc(self.clock.now),
                "started_at": utc(self.clock.now),
            },
        )
        nodes, edges = node_rows(task_id, spec)
        for row in nodes:
            changes.insert(Node, row)
        for row in edges:
            changes.insert(Edge, row)
        await self.store.write(changes)
        if notify:
            await self.step(TaskCreated(task_id))
        return task_id

    # ------------------------------------------------------------------ what happened

    def batches(self, device_id: str | None = None) -> list[CommandBatch]:
        return [
            s.message
            for s in self.links.sent
            if isinstance(s.message, CommandBatch) and (device_id is None or s.device_id == device_id)
        ]

    async def task(self, task_id: str) -> dict[str, Any]:
        """The stored truth: task state, node states and attempts (as a restart would see them)."""
        bundle = await self.store.get_task(task_id)
        assert bundle is not None
        return {
            "state": bundle.task.state,
            "nodes": {n.id: n.state for n in bundle.nodes},
            "edges": sorted((e.source, e.target, e.on) for e in bundle.edges),
            "errors": {n.id: (n.error or {}).get("code") for n in bundle.nodes},
            "attempts": [(a.node_id, a.device_id, a.status, (a.error or {}).get("code")) for a in bundle.attempts],
        }

    async def device(self, device_id: str) -> Device:
        row = await self.store.get_device(device_id)
        assert row is not None
        return row


def accepted(device_id: str, batch: CommandBatch) -> FrameIn:
    return FrameIn(device_id, BatchAccepted(batch_id=batch.batch_id))


def results(device_id: str, batch: CommandBatch, status: str = "success", **kw: Any) -> FrameIn:
    res = [
        Result(call_id=c.call_id, status=status, result={"ok": True} if status == "success" else None, **kw)  # type: ignore[arg-type]
        for c in batch.commands
    ]
    return FrameIn(device_id, ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=res))


def refused(device_id: str, batch: CommandBatch, code: str, fence_seen: int = 0) -> FrameIn:
    """What an agent sends for a batch it turned away unrun."""
    from protocol.messages import ErrorInfo

    res = [
        Result(call_id=c.call_id, status="skipped", error=ErrorInfo(code=code, message=f"refused: {code}"))
        for c in batch.commands
    ]
    return FrameIn(
        device_id, ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=res, fence_seen=fence_seen)
    )


def one_node(node_id: str = "n", tool_name: str = "sim.act", **extra: Any) -> dict[str, Any]:
    return {"nodes": [{"id": node_id, "commands": [{"tool": tool_name}], **extra}]}


def chain_dag(count: int) -> dict[str, Any]:
    """A DAG of `count` no-op `sim.act` nodes n0 -> n1 -> ..., each waiting on the one before."""
    names = [f"n{i}" for i in range(count)]
    return {
        "nodes": [{"id": n, "commands": [{"tool": "sim.act", "arguments": {"text": "x"}}]} for n in names],
        "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(names)],
    }


def ids(items: Iterable[CommandBatch]) -> list[str]:
    return [b.batch_id for b in items]
