"""A deterministic simulation of an Orrery cluster in one process (FoundationDB / VOPR style).

Real parts: the engine (`Engine`, driven through `recover` and `step`), the domain, and the
protocol (`Session`/`Channel` on both ends of every connection, frames encoded and decoded).
Simulated parts: devices (a small model of `device_agent` with its ledger rules), links (frames
lost, duplicated, delayed, reordered), the gateways of two replicas (a model of `gateway/hub.py`),
an in-memory store that can refuse writes, the engine lease, a lossy bus for hints, and a planner
that answers re-plans at chosen times. Everything runs on a virtual clock from one
`random.Random(seed)`, so a seed replays exactly; invariants are checked after every engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import itertools
import logging
import os
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from random import Random
from typing import Any

from orchestrator.config import Settings
from orchestrator.domain.controls import ControlAction
from orchestrator.domain.edits import AddEdge, AddNode, EditList, RemoveEdge, RemoveNode, UpdateNode
from orchestrator.domain.model import CommandSpec, DagSpec, EdgeSpec, Liveness, NodeSpec, TaskState
from orchestrator.domain.schedule import TICK_LABEL
from orchestrator.engine.approvals import REFUSALS
from orchestrator.engine.controls import controls_of, wire_state
from orchestrator.engine.core import Engine
from orchestrator.engine.intake import Submission
from orchestrator.engine.records import (
    CancelTask,
    ControlDevice,
    DecideApproval,
    DeviceHello,
    FrameIn,
    Input,
    LinkReport,
    LinkState,
    LivenessChanged,
    PlanFailed,
    PlanReady,
    ReplanDone,
    Route,
    SubmitTask,
)
from orchestrator.engine.schedule_records import ChangeSchedule, ScheduleAction
from orchestrator.engine.times import utc
from orchestrator.engine.writer import refused_data
from orchestrator.store.models import Approval, Attempt, Device, Edge, Node, NodeChild, Task
from orchestrator.store.repo import ChangeSet, LeaseLost, WriteConflict
from protocol.codec import encode
from protocol.errors import ProtocolError
from protocol.messages import (
    BatchAccepted,
    Cancel,
    CommandBatch,
    Error,
    Heartbeat,
    Hello,
    Message,
    ResultBatch,
    Welcome,
    is_reliable,
)
from protocol.session import AckPolicy, Channel, Role, Session, negotiate_version
from tests.sim import outcomes, view
from tests.sim.device import CRASH_POINTS, NEEDS_APPROVAL, TOOLS, Conn, LApproval, SimDevice, harmless, read_only
from tests.sim.memstore import POISON, MemStore

T0 = 1_800_000_000.0
LEASE = "engine"
REPLICAS = ("A", "B")
STORM_SEEDS = 1_000_000  # seeds from here on run a storm: every fault on, at higher rates
ORPHAN_S = 10.0  # how long, at most, a crashed agent's command runs on unless it is killed


class Violation(BaseException):
    """An invariant broke. A BaseException on purpose: it is often raised inside the engine (the
    store's write hook), and must pass through the engine's and tenacity's `except Exception`
    handlers instead of reading as a failed write."""


_SETTINGS: list[Settings] = []


def _settings() -> Settings:
    """One Settings for every world (building one costs more than a whole engine step)."""
    if not _SETTINGS:
        _SETTINGS.append(
            Settings(
                heartbeat_interval_s=2.0,
                heartbeat_timeout_s=8.0,
                batch_accept_timeout_s=8.0,
                queue_timeout_s=150.0,
                reconcile_interval_s=2.0,
                probe_timeout_s=60.0,
                approval_timeout_s=25.0,
            )
        )
    return _SETTINGS[0]


# ====================================================================== trace and clock


class Trace:
    """The last events (for a failure report) and a hash of all of them (for determinism)."""

    def __init__(self, keep: int = 200) -> None:
        self.lines: deque[str] = deque(maxlen=keep)
        self.hash = hashlib.sha256()
        self.count = 0

    def add(self, now: float, kind: str, text: str) -> None:
        line = f"{now - T0:9.3f} {kind:<8} {text}"
        self.count += 1
        self.lines.append(line)
        self.hash.update(line.encode())

    def digest(self) -> str:
        return self.hash.hexdigest()


def _short(msg: Message) -> str:
    if isinstance(msg, CommandBatch):
        return f"command_batch {msg.batch_id} f{msg.fence} seq{msg.seq}"
    if isinstance(msg, ResultBatch):
        sts = ",".join(r.status for r in msg.results)
        return f"result_batch {msg.batch_id} f{msg.fence} [{sts}] seq{msg.seq}"
    if isinstance(msg, BatchAccepted | Cancel):
        return f"{msg.type} {msg.batch_id} seq{msg.seq}"
    if isinstance(msg, Heartbeat):
        return f"heartbeat {msg.batch_id} ack{msg.ack}"
    if isinstance(msg, Error):
        return f"error {msg.code}"
    return f"{msg.type} seq{msg.seq} ack{msg.ack}"


def _describe(item: Input) -> str:
    if isinstance(item, FrameIn):
        return f"FrameIn({item.device_id}, {_short(item.message)})"
    if isinstance(item, DeviceHello):
        return f"DeviceHello({item.device_id}, resumed={item.resumed}, epoch={item.epoch}, {item.replica})"
    if isinstance(item, LinkReport):
        links = " ".join(f"{ln.device_id}@{ln.epoch}:{ln.liveness.value}:{ln.batch_id}" for ln in item.links)
        return f"LinkReport({item.replica}: {links})"
    if isinstance(item, LivenessChanged):
        return f"LivenessChanged({item.device_id}, {item.liveness.value}, {item.epoch}, {item.replica})"
    if isinstance(item, SubmitTask):
        return f"SubmitTask({item.submission.task_id}, asked_before={item.asked_before})"
    fields = {k: v for k, v in vars(item).items() if k not in ("done", "run", "hello")}
    return f"{type(item).__name__}({fields})"


# ====================================================================== knobs


@dataclass
class Faults:
    """Probabilities (per frame, per message, per second) the seed chose for its run."""

    loss: float = 0.0
    dup: float = 0.0
    jitter: float = 0.0  # extra delay on a frame, uniform in [0, jitter): reorders frames
    bus_loss: float = 0.0
    bus_jitter: float = 0.0
    disconnect: float = 0.0  # per device per second
    crash: float = 0.0  # per device per second: arm a crash at a ledger point
    store_fail: float = 0.0  # per engine step
    lease_loss: float = 0.0  # per second
    tool_failure: float = 0.0
    operator: float = 0.0  # per device per second: an operator cordons, drains, re-activates or revokes it

    @staticmethod
    def pick(rng: Random, storm: bool = False) -> Faults:
        """Each fault off or on at a random rate; in a storm, every fault is on and three times
        as likely (frame faults excepted: they would keep every connection broken)."""

        def p(hi: float) -> float:
            if storm:
                return rng.uniform(hi / 2, 3 * hi)
            return rng.choice((0.0, rng.uniform(0, hi)))

        return Faults(
            loss=p(0.05) / (3 if storm else 1),
            dup=p(0.05),
            jitter=p(0.3) / (3 if storm else 1),
            bus_loss=p(0.3),
            bus_jitter=p(3.0),
            disconnect=p(0.03),
            crash=p(0.02),
            store_fail=p(0.03),
            lease_loss=p(0.02),
            tool_failure=p(0.2),
            operator=p(0.03),
        )


QUIET = Faults()


# ====================================================================== gateways


@dataclass
class Link:
    device_id: str
    session: Session
    conn: Conn | None = None
    epoch: int = 0
    batch_id: str | None = None
    control_gen: int = 0
    last_frame: float = 0.0
    liveness: Liveness = Liveness.ONLINE
    waiting: int = 0
    acks: AckPolicy = field(init=False)

    def __post_init__(self) -> None:
        self.acks = AckPolicy(self.session)


class Gateway:
    """`gateway/hub.py` in miniature: sessions, resume, confirm-after-engine, liveness, reports."""

    def __init__(self, world: World, replica: str) -> None:
        self.world = world
        self.replica = replica
        self.links: dict[str, Link] = {}
        self.sessions = itertools.count(1)

    def send(self, device_id: str, message: Message, epoch: int) -> bool:
        link = self.links.get(device_id)
        if link is None or link.epoch < epoch:
            return False
        stamped = link.session.stamp(message)
        if link.conn is not None and link.conn.open:
            self.world.to_device(link.conn, encode(stamped))
        return True

    def frame(self, conn: Conn, data: str) -> None:
        if not conn.open:
            return
        conn.inbound.append(data)
        self._pump(conn)

    def _pump(self, conn: Conn) -> None:
        while conn.open and conn.inbound and not conn.reading:
            self._read(conn, conn.inbound.popleft())

    def _read(self, conn: Conn, data: str) -> None:
        w = self.world
        try:
            msg = conn.server.receive(data)
        except ProtocolError as exc:
            w.log("gateway", f"{self.replica} {conn.device.id} protocol error {exc.code}: {exc}")
            w.close_conn(conn, f"server protocol error {exc.code}")
            return
        if isinstance(msg, Hello):
            self._hello(conn, msg)
            return
        link = self.links.get(conn.device.id)
        if link is None or link.conn is not conn:
            w.close_conn(conn, "superseded")
            return
        link.last_frame = w.now
        self._online(link)
        if msg is None:
            return
        if isinstance(msg, Heartbeat):
            link.batch_id = msg.batch_id
            if msg.control_gen != link.control_gen:  # applied: the gateway tells the engine at once
                link.control_gen = msg.control_gen
                live = self.world.now - link.last_frame
                state = LinkState(
                    link.device_id, link.epoch, link.liveness, max(0.0, live), link.batch_id, link.control_gen
                )
                self.world.notify(LinkReport(self.replica, [state]), self.replica)
            w.to_device(conn, conn.server.send(link.session.heartbeat_reply()))
        elif isinstance(msg, BatchAccepted):
            w.notify(FrameIn(conn.device.id, msg), self.replica)
            link.session.confirm(msg.seq)
        elif is_reliable(msg):
            seq = msg.seq
            if isinstance(msg, ResultBatch) and msg.batch_id == link.batch_id:
                link.batch_id = None

            def confirmed(ok: bool, _value: Any) -> None:
                if ok:
                    link.session.confirm(seq)
                    if isinstance(msg, ResultBatch):
                        w.unverified_acks.append(msg.batch_id)
                    due = link.acks.confirmed(w.now)  # the session's ack policy, as the hub asks it
                    if due is not None:
                        w.at(due - w.now, partial(self._ack_if_due, link, conn, due), "standalone ack")

            self._engine(conn, link, FrameIn(conn.device.id, msg), confirmed)

    def _ack_if_due(self, link: Link, conn: Conn, due: float) -> None:
        if link.conn is conn and conn.open and link.acks.timer_ran(due):
            self.world.to_device(conn, conn.server.send(link.session.heartbeat_reply()))

    def _engine(self, conn: Conn, link: Link, item: Input, then: Callable[[bool, Any], None]) -> None:
        """Submit and wait: the reader reads nothing more until the engine answered; an engine
        that cannot answer (down, failed over) ends the connection unacknowledged."""
        conn.reading = True
        link.waiting += 1

        def answer(ok: bool, value: Any) -> None:
            conn.reading = False
            link.waiting -= 1
            link.last_frame = self.world.now
            if not ok:
                self.world.close_conn(conn, "engine unavailable")
                return
            then(ok, value)
            self._pump(conn)

        self.world.submit(item, answer, self.replica)

    def _hello(self, conn: Conn, hello: Hello) -> None:
        w = self.world
        version = negotiate_version(hello.versions)
        epoch = w.store_open_session(hello.device_id)
        link = self.links.get(hello.device_id)
        if link is not None and link.conn is not None and link.conn is not conn:
            w.close_conn(link.conn, "superseded by a newer connection")
        resumed = link is not None and link.session.resumes(hello)
        if not resumed or link is None:
            link = Link(hello.device_id, Session(f"s_{self.replica}{next(self.sessions)}", version))
            self.links[hello.device_id] = link
        link.conn, link.epoch, link.last_frame = conn, epoch, w.now
        link.control_gen = hello.control_gen
        conn.epoch = epoch
        welcome = Welcome(
            session_id=link.session.session_id,
            version=version,
            heartbeat_interval_s=w.settings.heartbeat_interval_s,
            heartbeat_timeout_s=w.settings.heartbeat_timeout_s,
            max_frame_bytes=w.settings.max_frame_bytes,
            resumed=resumed,
            control=wire_state(controls_of(w.store.device(hello.device_id))),
        )
        text, resend = conn.server.accept(hello, link.session, welcome)
        w.to_device(conn, text)
        for frame in resend:
            w.to_device(conn, frame)
        self._online(link)
        final = link

        def answer(ok: bool, current: Any) -> None:
            if ok and current is False and self.links.get(hello.device_id) is final and final.conn is conn:
                del self.links[hello.device_id]
                w.close_conn(conn, "superseded (engine)")

        self._engine(conn, link, DeviceHello(hello.device_id, hello, resumed, epoch, self.replica), answer)

    def _online(self, link: Link) -> None:
        if link.liveness is not Liveness.ONLINE:
            link.liveness = Liveness.ONLINE
            self.world.notify(LivenessChanged(link.device_id, link.liveness, link.epoch, self.replica), self.replica)

    def lost(self, conn: Conn) -> None:
        link = self.links.get(conn.device.id)
        if link is not None and link.conn is conn:
            link.conn = None

    def watch(self) -> None:
        """Every interval: suspect after two silent intervals, offline (session ended) after the
        timeout; then the periodic link report."""
        w, s = self.world, self.world.settings
        for device_id in sorted(self.links):
            link = self.links[device_id]
            if link.waiting:
                continue
            silent = w.now - link.last_frame
            if silent > s.heartbeat_timeout_s:
                del self.links[device_id]
                if link.conn is not None:
                    w.close_conn(link.conn, "heartbeat timeout")
                link.liveness = Liveness.OFFLINE
                w.notify(LivenessChanged(device_id, link.liveness, link.epoch, self.replica), self.replica)
            elif silent > s.suspect_after_s and link.liveness is Liveness.ONLINE:
                link.liveness = Liveness.SUSPECT
                w.notify(LivenessChanged(device_id, link.liveness, link.epoch, self.replica), self.replica)
        report = LinkReport(
            self.replica,
            [
                LinkState(
                    d,
                    ln.epoch,
                    ln.liveness,
                    0.0 if ln.waiting else max(0.0, w.now - ln.last_frame),
                    ln.batch_id,
                    ln.control_gen,
                )
                for d, ln in sorted(self.links.items())
            ],
        )
        w.notify(report, self.replica)


# ====================================================================== the cluster's side of the engine


class EngineLinks:
    """`Engine.links`: frames go to the gateway holding the device, over the (lossy) relay when
    that is another replica than the engine's."""

    def __init__(self, world: World, replica: str) -> None:
        self.world = world
        self.replica = replica

    def send(self, device_id: str, message: Message, route: Route) -> bool:
        w = self.world
        target = route.replica or next((r for r in REPLICAS if device_id in w.gateways[r].links), None)
        if target is None:
            return False
        gateway = w.gateways[target]
        link = gateway.links.get(device_id)
        if link is None or link.epoch < route.epoch:
            return False
        w.log("send", f"{self.replica}->{target} {device_id} {_short(message)}")
        if target == self.replica:
            return gateway.send(device_id, message, route.epoch)
        w.bus(partial(_ignore, gateway.send, device_id, message, route.epoch), f"relay {_short(message)} to {target}")
        return True

    def close(self, device_id: str, code: int, reason: str, route: Route) -> None:
        gateway = self.world.gateways.get(route.replica or "")
        if gateway is not None:
            link = gateway.links.pop(device_id, None)
            if link is not None and link.conn is not None:
                self.world.close_conn(link.conn, reason)


class SimPlanner:
    """PlannerHooks: answers a re-plan after a seed-chosen delay (the graph may have moved on
    meanwhile), with an error, no edits, or real edits: route the failed node's pending
    successors around it through a new node, remove a pending node, or rewrite one. Edits that
    no longer fit the graph when they arrive must be refused whole."""

    def __init__(self, world: World) -> None:
        self.world = world

    def replan(self, task_id: str, node_id: str, context: dict[str, Any]) -> None:
        w = self.world
        roll = w.rng.random()
        error = "the planner could not help" if roll < 0.2 else None
        edits = self.edits(node_id, context) if roll >= 0.4 else None
        w.log("planner", f"replan {task_id}/{node_id} asked: {edits.reason if edits else error or 'no edits'}")
        done = ReplanDone(task_id, node_id, edits, error)
        w.at(w.rng.uniform(0.1, 8.0), lambda: w.submit(done, None), "replan done")

    def edits(self, failed: str, context: dict[str, Any]) -> EditList:
        w = self.world
        states = {n["id"]: n["state"] for n in context["nodes"]}
        specs = {n["id"]: n["spec"] for n in context["nodes"]}
        pending = sorted(n for n, state in states.items() if state == "pending")
        kind = w.rng.choice(("route around", "remove", "rewrite")) if pending else "route around"
        ops: list[AddNode | UpdateNode | RemoveNode | AddEdge | RemoveEdge] = []
        if kind == "route around":
            fix = w.new_id("fix")
            ops += [
                AddNode(node=NodeSpec(id=fix, commands=[CommandSpec(tool=w.rng.choice(sorted(TOOLS)))])),
                AddEdge(edge=EdgeSpec.model_validate({"from": failed, "to": fix, "on": "failure"})),
            ]
            for e in context["edges"]:
                if e.source == failed and states.get(e.target) == "pending":
                    ops += [
                        RemoveEdge.model_validate({"from": failed, "to": e.target}),
                        AddEdge(edge=EdgeSpec.model_validate({"from": fix, "to": e.target, "on": "success"})),
                    ]
        elif kind == "remove":
            victim = w.rng.choice(pending)
            ops += [
                RemoveEdge.model_validate({"from": e.source, "to": e.target})
                for e in context["edges"]
                if victim in (e.source, e.target)
            ]
            ops.append(RemoveNode(id=victim))
        else:
            victim = w.rng.choice(pending)
            spec = NodeSpec.model_validate({**specs[victim], "commands": [{"tool": w.rng.choice(sorted(TOOLS))}]})
            ops.append(UpdateNode(node=spec))
        return EditList(reason=f"sim: {kind}", edits=ops)

    def start_agent(self, *args: Any) -> None:
        pass

    def cancel_agent(self, attempt_id: str) -> None:
        pass

    def start_planning(self, task_id: str, request: str) -> None:
        """A plan (or a planning failure) after a while, from this engine's planner: if that
        engine dies first, the answer dies with it (the next engine asks again)."""
        w = self.world
        engine = w.engine
        answer: Input
        if w.rng.random() < 0.1:
            answer = PlanFailed(task_id, "plan_invalid", "the model's plan did not validate")
        else:
            answer = PlanReady(task_id, None, w.dag(), request)
        w.log("planner", f"planning {task_id}: {type(answer).__name__} to come")

        def deliver() -> None:
            if w.engine is engine and engine is not None:
                w.submit(answer, None)

        w.at(w.rng.uniform(0.1, 6.0), deliver, "plan done")


# ====================================================================== the world


@dataclass
class Submitted:
    task_id: str
    spec: DagSpec | None  # None: planned from a request
    acked: bool = False  # the engine's answer reached the API
    asks: int = 0
    cancel_at: float | None = None


class World:
    def __init__(self, seed: int, fault_s: float = 40.0, heal_s: float = 200.0) -> None:
        self.seed = seed
        self.rng = Random(seed)
        self.now = T0
        self.trace = Trace(int(os.environ.get("SIM_TRACE_KEEP", "200")))
        self.fault_s, self.heal_s = fault_s, heal_s
        self.faults = Faults.pick(self.rng, storm=seed >= STORM_SEEDS)
        self.settings = _settings()
        self.store = MemStore(lambda: self.now)
        self.store.on_write = self._check_write
        # Results whose text the store cannot hold: their own generator, so seeds without this
        # fault run as before. In a storm, always on.
        self.poison_rng = Random(seed + 0x5EED)
        storm = seed >= STORM_SEEDS
        self.poison_rate = self.poison_rng.uniform(0.03, 0.1) if storm else self.poison_rng.choice((0.0, 0.0, 0.05))
        self.store.poison = self.poison_rate > 0
        # The leader's lease session lost while its process lives on (its connection to the store
        # cut): its own generator too, so seeds without this fault run as before. In a storm,
        # always on.
        self.session_rng = Random(seed + 0x5E55)
        session_rate = self.session_rng.uniform(0.0, 0.03)
        self.session_loss = (
            self.session_rng.uniform(0.01, 0.05) if storm else self.session_rng.choice((0.0, 0.0, session_rate))
        )
        self.events: list[tuple[float, int, Callable[[], None], str]] = []
        self.seq = itertools.count()
        self.ids = itertools.count(1)
        self.conns = itertools.count(1)
        self.gateways = {r: Gateway(self, r) for r in REPLICAS}
        self.devices: dict[str, SimDevice] = {}
        self.tasks: dict[str, Submitted] = {}
        self.engine: Engine | None = None
        self.leader: str | None = None
        # Each replica's lease session (`holder_pid`), and the engine of a leader succeeded while
        # it lives on: it acts until a commit of its is refused or its renewal finds the lease lost.
        self.lease_sessions = {r: i for i, r in enumerate(REPLICAS, 1)}
        self.session_ids = itertools.count(len(REPLICAS) + 1)
        self.stale: Engine | None = None
        self.stale_replica: str | None = None
        self.stale_inbox: list[tuple[Input, Callable[[bool, Any], None] | None]] = []
        self.stale_due = False
        self.inbox: list[tuple[Input, Callable[[bool, Any], None] | None]] = []
        self.step_due = False
        self.steps = 0
        self.engines_started = 0
        self.executions: dict[tuple[str, str, str], list[str]] = {}  # (task, node, call) -> batch ids
        self.device_fence_floor: dict[str, int] = {}
        self.attempt_fence_floor: dict[str, int] = {}
        self.engine_errors: list[str] = []
        self.restarting = False
        self.healing = False
        self.loop = asyncio.new_event_loop()
        self.submissions_due = 0  # tasks the API client has yet to store
        self.unverified_acks: list[str] = []  # result batches acknowledged since the last check
        # Executions under way: token -> (node key, device, orphaned); a node key is (task, node,
        # fan-out child's device or ""). Two at once for one key is a violation.
        self.active: dict[int, tuple[tuple[str, str, str], str, bool]] = {}
        self.tokens = itertools.count(1)
        self.denied: set[tuple[str, str, str]] = set()  # nodes whose open attempt's approval the store denied
        self.resuming: set[str] = set()  # devices an operator resumes in the step under way
        self.people: set[str] = set()  # approvals an operator has considered
        # How far each replica's clock is behind the world's (a leader whose clock is behind).
        self.skew = {"A": 0.0, "B": 0.0}
        self.schedule_id: str | None = None
        self.seen: Counter[str] = Counter()  # the people and controls paths a run took

    # ------------------------------------------------------------------ scheduling

    def at(self, delay: float, fn: Callable[[], None], what: str) -> None:
        heapq.heappush(self.events, (self.now + max(0.0, delay), next(self.seq), fn, what))

    def log(self, kind: str, text: str) -> None:
        self.trace.add(self.now, kind, text)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self.ids):06d}"

    # ------------------------------------------------------------------ links and bus

    def open_conn(self, device: SimDevice, replica: str) -> Conn:
        conn = Conn(next(self.conns), device, replica, Channel(Role.SERVER), Channel(Role.AGENT))
        self.log("conn", f"{device.id} opens #{conn.id} on {replica}")
        return conn

    def close_conn(self, conn: Conn, why: str) -> None:
        if not conn.open:
            return
        conn.open = False
        conn.server.close()
        self.log("conn", f"{conn.device.id} #{conn.id} closed: {why}")
        self.gateways[conn.replica].lost(conn)
        conn.device.lost(conn)

    def _wire(self, conn: Conn, deliver: Callable[[], None], what: str) -> None:
        f = self.faults
        if self.rng.random() < f.loss:
            self.log("fault", f"lost {what}")
            return
        copies = 2 if self.rng.random() < f.dup else 1
        for _ in range(copies):
            self.at(0.005 + self.rng.random() * f.jitter, deliver, what)
        if copies == 2:
            self.log("fault", f"duplicated {what}")

    def to_server(self, conn: Conn, data: str) -> None:
        self._wire(conn, lambda: self.gateways[conn.replica].frame(conn, data), f"#{conn.id} up")

    def to_device(self, conn: Conn, data: str) -> None:
        self._wire(conn, lambda: conn.device.receive(conn, data), f"#{conn.id} down")

    def bus(self, deliver: Callable[[], None], what: str) -> None:
        f = self.faults
        if self.rng.random() < f.bus_loss:
            self.log("fault", f"bus lost {what}")
            return
        self.at(0.002 + self.rng.random() * f.bus_jitter, deliver, what)

    def notify(self, item: Input, replica: str) -> None:
        """A hint for the engine: direct on the leader's replica, else over the lossy bus."""
        if self.stale is not None and replica == self.stale_replica:  # it believes it still leads
            self.submit_stale(item, None)
            return
        if replica == self.leader and self.engine is not None:
            self.submit(item, None)
            return
        self.bus(lambda: self.submit(item, None), f"hint {type(item).__name__}")

    def submit(self, item: Input, reply: Callable[[bool, Any], None] | None, replica: str | None = None) -> None:
        if replica is not None and self.stale is not None and replica == self.stale_replica:
            self.submit_stale(item, reply)  # a gateway of the replica that believes it still leads
            return
        if self.engine is None:
            if reply is not None:
                reply(False, None)
            return
        self.inbox.append((item, reply))
        if not self.step_due:
            self.step_due = True
            self.at(0.0, self.engine_step, "engine step")

    def store_open_session(self, device_id: str) -> int:
        row = self.store.table(Device).get((device_id,))
        if row is None:
            return 0
        row.session_epoch = int(row.session_epoch or 0) + 1
        return int(row.session_epoch)

    # ------------------------------------------------------------------ the engine

    def start_engine(self, replica: str) -> None:
        self.restarting = False
        fence = self.store.take_lease(LEASE, replica, 1e9, self.lease_sessions[replica])
        if fence is None:
            self.at(1.0, partial(self.start_engine, replica), "engine start")
            return
        skew = self.skew[replica]
        engine = Engine(
            self.settings,
            self.store,  # type: ignore[arg-type]
            _NullBus(),
            clock=lambda: self.now - skew,
            rng=self.rng.random,
            ids=self.new_id,
            sleep=_no_sleep,
        )
        engine.links = EngineLinks(self, replica)
        engine.planner = SimPlanner(self)
        engine.schedules.load_rows = self.store.load_schedules
        engine.schedules.prune_rows = self.store.prune_ticks
        engine.on_fatal = lambda exc: None
        engine.replica_id = replica
        engine.lease_guard = (LEASE, replica, fence)
        self.engines_started += 1
        self.log("engine", f"starts on {replica} (lease fence {fence})")
        self.engine, self.leader = engine, replica
        try:
            self._run(engine.recover())
        except Exception as exc:
            self._engine_died(engine, exc)
            return
        self.check_fences(engine, after_recover=True)
        self.check_restart_agrees()
        for gw in self.gateways.values():  # the cluster re-announces links to a new leader
            gw.watch()

    def poisoned_output(self) -> bool:
        """Whether a command's output carries text the store cannot hold (a seed's fault)."""
        return bool(self.poison_rate) and not self.healing and self.poison_rng.random() < self.poison_rate

    def _engine_died(self, engine: Engine, exc: BaseException) -> None:
        self.log("engine", f"FATAL {type(exc).__name__}: {exc}")
        self.store.refused.clear()
        if refused_data(exc) and not isinstance(exc, WriteConflict):
            self.fail(f"the engine stopped on an input the store refused for its data: {exc!r}")
        if isinstance(exc, WriteConflict):  # not a fault the simulation injects: a row written twice
            self.fail(f"the engine wrote a row that exists: {exc}")
        self._engine_gone(engine)

    def _engine_gone(self, engine: Engine | None) -> None:
        """The engine stopped: inputs waiting on it fail (their connections close unacknowledged),
        and a supervisor starts one again, here or (the lease gone) on either replica."""
        if self.engine is engine:
            self.engine = None
            pending, self.inbox = self.inbox, []
            _refuse(pending)
        self._restart_soon()

    def _restart_soon(self) -> None:
        if self.restarting or self.engine is not None:
            return
        self.restarting = True
        lease = self.store.leases.get(LEASE)
        replica = self.leader or REPLICAS[0]
        if lease is not None and lease.expires <= self.now:
            replica = self.rng.choice(REPLICAS)
        self.at(self.rng.uniform(0.5, 3.0), partial(self.start_engine, replica), "engine start")

    def engine_step(self) -> None:
        self.step_due = False
        engine = self.engine
        if engine is None:
            return
        items, self.inbox = self.inbox, []
        loop = self.loop
        futures = []
        self.resuming = {
            item.device_id
            for item, _ in items
            if isinstance(item, ControlDevice) and item.action is ControlAction.RESUME
        }
        for item, reply in items:
            item.done = loop.create_future()
            futures.append((item.done, reply))
            self.log("input", _describe(item))
        if self.healing or self.rng.random() >= self.faults.store_fail:
            pass
        else:
            self.store.fail_next = self.rng.choice((1, 2, 5))
            self.log("fault", f"store refuses the next {self.store.fail_next} writes")
        self.steps += 1
        try:
            self._run(engine.step([item for item, _ in items]))
        except Exception as exc:
            self.store.fail_next = 0
            self._engine_died(engine, exc)
            # The step's own inputs get no answer from a dead engine either: their gateways close
            # those connections unacknowledged (the cluster's request times out, or the process
            # dies with its sockets), and the devices resume and send again.
            _refuse(futures)
            return
        self.store.fail_next = 0
        _answer(futures)
        self.check_refused()
        self.check_step(engine)

    def _run(self, coro: Any) -> Any:
        """Run a coroutine of the engine or the store to its end at once: nothing in the simulation
        really waits (the store answers immediately, retries do not sleep), so a coroutine that
        suspends would be a simulation bug, not a scheduling choice."""
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        coro.close()
        raise RuntimeError("a simulated coroutine suspended: something awaited real time or I/O")

    def tick(self) -> None:
        if self.engine is not None:
            self.submit_tick()
        self.at(1.0, self.tick, "tick")

    def submit_tick(self) -> None:
        if not self.step_due:
            self.step_due = True
            self.at(0.0, self.engine_step, "engine step")

    def watch(self) -> None:
        for gw in self.gateways.values():
            gw.watch()
        self.at(self.settings.link_report_interval_s, self.watch, "link reports")

    # ------------------------------------------------------------------ faults over time

    def chaos(self) -> None:
        if self.healing:
            return
        f = self.faults
        for device_id in sorted(self.devices):
            dev = self.devices[device_id]
            if dev.conn is not None and self.rng.random() < f.disconnect:
                self.close_conn(dev.conn, "injected disconnect")
            if dev.alive and dev.crash_at is None and self.rng.random() < f.crash:
                dev.crash_at = self.rng.choice((*CRASH_POINTS, "now"))
                self.log("fault", f"{device_id} will crash at {dev.crash_at}")
                if dev.crash_at == "now":
                    dev.crash_at = None
                    dev.crash("injected")
        for device_id in sorted(self.devices):
            if self.rng.random() < f.operator:
                # dev_0 has every tool: revoking it could leave nodes no device can ever run.
                choices = ("cordon", "drain", "uncordon", "stop", "resume", "resume", "takeover", "handback")
                self.control(device_id, self.rng.choice(choices + (("revoke",) if device_id != "dev_0" else ())))
            if self.rng.random() < f.operator / 3:
                dev = self.devices[device_id]
                held = dev.owner_takeover is not None and dev.owner_takeover.taken_over
                dev.owner_takes_over(not held)
            if self.rng.random() < f.operator / 3:
                dev = self.devices[device_id]
                dev.kill_switch = not dev.kill_switch
                self.log("owner", f"{device_id} kill switch {'on' if dev.kill_switch else 'off'}")
        if self.engine is not None and self.rng.random() < f.lease_loss:
            self.log("fault", f"lease of {self.leader} expires")
            self.store.expire_lease(LEASE)
            old = self.engine

            def takeover() -> None:
                if self.engine is old:  # the cluster notices the lost renewal and stops it
                    self.log("engine", "stopped: lease lost")
                self._engine_gone(old)

            self.at(self.rng.uniform(0.2, 3.0), takeover, "takeover")
        if self.engine is not None and self.stale is None and self.session_rng.random() < self.session_loss:
            self.lose_session()
        self.at(1.0, self.chaos, "chaos")

    # ------------------------------------------------------------------ a leader's session lost

    def lose_session(self) -> None:
        """The leader's lease session ends while its process lives on (its connection to the
        store cut): the other replica, trying for the lease, finds that session gone and takes
        the lease at once, with the next fence, and starts its engine from the store. The old
        engine runs on (inputs from its own replica, which believes it still leads, and its
        timers) until a commit of its is refused (`LeaseLost`) or its next renewal, on a new
        connection, finds the lease lost; then it stops (the cluster's `_lose_lead`)."""
        old, replica = self.engine, self.leader
        assert old is not None and replica is not None
        other = next(r for r in REPLICAS if r != replica)
        self.log("fault", f"the lease session of {replica} ends; {other} takes the lease at once")
        self.seen["lease taken from a session gone"] += 1
        self.store.end_session(self.lease_sessions[replica])
        self.lease_sessions[replica] = next(self.session_ids)  # its lease connection made again
        self.stale, self.stale_replica = old, replica
        self.stale_inbox, self.inbox = self.inbox, []  # what was submitted to it stays its own
        self.engine = None
        if self.stale_inbox:
            self._stale_step_soon()
        notice = self.session_rng.uniform(0.05, 3.0)
        self.at(notice, partial(self.stale_stops, old, "its renewal finds the lease lost"), "renewal")
        self.at(self.session_rng.uniform(0.0, 1.0), partial(self.stale_tick, old), "old engine's timers")
        self.start_engine(other)

    def submit_stale(self, item: Input, reply: Callable[[bool, Any], None] | None) -> None:
        self.stale_inbox.append((item, reply))
        self._stale_step_soon()

    def _stale_step_soon(self) -> None:
        if not self.stale_due:
            self.stale_due = True
            self.at(0.0, self.stale_step, "old engine step")

    def stale_tick(self, engine: Engine) -> None:
        if self.stale is engine:
            self._stale_step_soon()
            self.at(1.0, partial(self.stale_tick, engine), "old engine's timers")

    def stale_step(self) -> None:
        """A step of the old engine: a commit of its is refused (the lease has a new fence), and
        then it stops; a step that commits nothing answers from its memory."""
        self.stale_due = False
        engine = self.stale
        if engine is None:
            return
        items, self.stale_inbox = self.stale_inbox, []
        futures = []
        for item, reply in items:
            item.done = self.loop.create_future()
            futures.append((item.done, reply))
            self.log("input", f"old engine on {self.stale_replica}: {_describe(item)}")
        try:
            self._run(engine.step([item for item, _ in items]))
        except LeaseLost as exc:
            self.seen["old engine's commit refused"] += 1
            self.stale_stops(engine, f"a commit of its was refused: {exc}")
            _refuse(futures)
            return
        except Exception as exc:
            self.fail(f"the old engine's step failed otherwise than on its lost lease: {exc!r}")
        _answer(futures)

    def stale_stops(self, engine: Engine, why: str) -> None:
        """The old engine stops for good; what waits on it is refused (its connections close
        unacknowledged, its requests are asked again)."""
        if self.stale is not engine:
            return
        self.log("engine", f"old engine on {self.stale_replica} stops: {why}")
        self.stale, self.stale_replica = None, None
        pending, self.stale_inbox = self.stale_inbox, []
        _refuse(pending)

    # ------------------------------------------------------------------ the fleet and its work

    def control(self, device_id: str, action: str) -> None:
        """What the API does for an operator: ask the engine, the one writer of a device's
        controls, through the cluster (over the lossy bus from a follower), again and again until
        it answers, always as the same request; a resume or an uncordon names the generation the
        operator read."""
        row = self.store.device(device_id)
        if row.admin_state == "revoked":
            return
        expect = controls_of(row).gen if action in ("resume", "uncordon") else None
        request_id = self.new_id("req")
        self.log("api", f"operator: {action} {device_id} (generation {expect})")
        answer: list[bool] = []

        def ask(asks: int) -> None:
            if answer or asks > 30:
                return
            item = ControlDevice(
                device_id, ControlAction(action), f"{action} by an operator", request_id, expect, "operator"
            )
            self._ask(item, lambda ok, v: answer.append(True) if ok else None)
            self.at(2.0, partial(ask, asks + 1), "ask again")

        ask(0)

    def _ask(self, item: Input, answered: Callable[[bool, Any], None]) -> None:
        """A request from the API of a random replica to the engine leader; the answer may be lost."""
        replica = self.rng.choice(REPLICAS)
        if self.stale is not None and replica == self.stale_replica:  # it believes it still leads
            self.submit_stale(item, answered)
        elif replica == self.leader and self.engine is not None:
            self.submit(item, answered)
        else:
            self.bus(lambda: self.submit(item, lambda ok, v: self.bus(lambda: answered(ok, v), "answer")), "ask")

    def approvals_due(self) -> None:
        """Operators look at the pending approvals now and then and decide some of them (racing the
        device's owner, the expiry and cancels)."""
        if not self.healing:
            for _key, row in sorted(self.store.table(Approval).items()):
                if row.state != "pending" or row.id in self.people:
                    continue
                self.people.add(row.id)
                if self.rng.random() < 0.6:
                    decision = "approved" if self.rng.random() < 0.7 else "denied"
                    self.at(self.rng.uniform(0.2, 12.0), partial(self.operator_decides, row.id, decision), "decide")
        self.at(1.0, self.approvals_due, "approvals")

    def operator_decides(self, approval_id: str, decision: str) -> None:
        self.log("api", f"operator: {decision} {approval_id}")
        self._ask(DecideApproval(approval_id, decision, "api key sim"), lambda ok, v: None)

    def create_schedule(self) -> None:
        """A schedule ticking every 10 s (its ticks cross leader changes, and replica B's clock may
        be behind): every tick makes one task, never two, whoever leads."""
        self.schedule_id = self.new_id("sch")
        dag = {"nodes": [{"id": "s1", "commands": [{"tool": "sim.look", "timeout_s": 5}]}], "edges": []}
        definition = {
            "name": "every-10s",
            "cron": "*/10 * * * * *",
            "timezone": "UTC",
            "task": {"dag": dag},
            "overlap": self.rng.choice(("skip", "queue")),
            "starting_deadline_s": 60.0,
            "max_queued": 2,
            "created": self.now,
        }
        self.change_schedule(ScheduleAction.CREATE, definition)

    def change_schedule(self, action: ScheduleAction, definition: dict[str, Any] | None = None, asks: int = 0) -> None:
        assert self.schedule_id is not None
        item = ChangeSchedule(action, self.schedule_id, definition)
        self.log("api", f"schedule {self.schedule_id}: {action.value}")

        def answered(ok: bool, value: Any) -> None:
            if not ok and asks < 20:
                self.at(1.0, partial(self.change_schedule, action, definition, asks + 1), "again")

        self._ask(item, answered)

    def owner_may_decide(self, device: SimDevice, approval_id: str) -> None:
        """The device's owner may decide at the device, at any moment."""
        if self.rng.random() < 0.4:
            decision = "approved" if self.rng.random() < 0.7 else "denied"
            device.later(self.rng.uniform(0.2, 12.0), partial(device.owner_decides, approval_id, decision), "owner")

    def enroll(self, n: int) -> None:
        for i in range(n):
            device_id = f"dev_{i}"
            tools = sorted(TOOLS) if i == 0 else sorted(self.rng.sample(sorted(TOOLS), self.rng.randint(1, 3)))
            self.store.table(Device)[(device_id,)] = Device(
                id=device_id,
                name=f"d{i}",
                token_hash=f"h{i}",
                labels={},
                reported_labels={},
                platform="linux",
                info={},
                tools=[],
                admin_state="active",
                liveness="enrolled",
                fence=0,
                session_epoch=0,
                current_batch_id=None,
                created_at=utc(self.now),
            )
            self.devices[device_id] = SimDevice(self, device_id, tools, max_bad=self.rng.choice((0, 0, 2)))

    def dag(self) -> DagSpec:
        n = self.rng.randint(2, 6)
        nodes, edges = [], []
        for i in range(n):
            commands = [
                {
                    "tool": self.rng.choice(sorted(TOOLS)),
                    "timeout_s": 5,
                    "idempotent": self.rng.random() < 0.1,
                }
                for _ in range(self.rng.randint(1, 2))
            ]
            node: dict[str, Any] = {
                "id": f"n{i}",
                "commands": commands,
                "retry": {"max_attempts": self.rng.randint(1, 3), "backoff_s": 0.5},
            }
            if self.rng.random() < 0.25:
                node["for_each"] = self.for_each()
            if self.rng.random() < 0.25:
                node["verify"] = [{"tool": "sim.look", "timeout_s": 5}]
            nodes.append(node)
            if i:
                for src in sorted(set(self.rng.sample(range(i), min(i, self.rng.randint(1, 2))))):
                    on = "failure" if self.rng.random() < 0.15 else "success"
                    edges.append({"from": f"n{src}", "to": f"n{i}", "on": on})
        return DagSpec.model_validate({"nodes": nodes, "edges": edges})

    def for_each(self) -> dict[str, Any]:
        """A fan-out over every device that has the tools, or over some named ones (issue 20)."""
        names = sorted(self.devices)
        out: dict[str, Any] = {}
        if self.rng.random() < 0.5:
            picked = self.rng.sample(names, self.rng.randint(1, len(names)))
            out["devices"] = [f"d{int(d.split('_')[1])}" if self.rng.random() < 0.5 else d for d in picked]
        if self.rng.random() < 0.4:
            out["canary"] = self.rng.randint(1, 2)
        if self.rng.random() < 0.4:
            out["max_parallel"] = self.rng.randint(1, 2)
        if self.rng.random() < 0.4:
            out["failure_budget"] = self.rng.randint(1, 2)
        return out

    def submit_task(self) -> None:
        """A new task at the API of a random replica, handed to the engine (which stores it)."""
        planned = self.rng.random() < 0.2  # from a request: the planner makes the DAG later
        spec = None if planned else self.dag()
        task_id = self.new_id("task")
        sub = Submission(
            task_id=task_id,
            name=task_id,
            body_hash=task_id,
            created=self.now,
            spec=spec,
            request="plan it" if planned else None,
            replan=planned or self.rng.random() < 0.3,
        )
        self.tasks[task_id] = Submitted(task_id, spec)
        shape = f"{len(spec.nodes)} nodes" if spec is not None else "to be planned"
        self.log("api", f"task {task_id} submitted ({shape}, replan={sub.replan})")
        self.ask_to_admit(sub, asked_before=False)

    def ask_to_admit(self, sub: Submission, asked_before: bool) -> None:
        """What the cluster does for the API: ask the engine leader (over the lossy bus from a
        follower) until an answer comes back; a lost answer means asking again, as asked before."""
        task = self.tasks[sub.task_id]
        if task.acked:
            return
        task.asks += 1
        ask = task.asks
        item = SubmitTask(sub, asked_before=asked_before)

        def answered(ok: bool, value: Any) -> None:
            if ask != task.asks or task.acked:
                return  # an answer to an earlier ask, already given up on
            if not ok:
                self.at(1.0, partial(self.ask_to_admit, sub, True), "ask again")
                return
            if value["task_id"] != sub.task_id or not value["created"]:
                self.fail(f"submission {sub.task_id} was admitted as {value}")
            task.acked = True
            self.submissions_due -= 1
            self.log("api", f"task {sub.task_id} admitted")
            if self.rng.random() < 0.1:
                self.at(self.rng.uniform(0.5, 20.0), partial(self.cancel_task, sub.task_id), "cancel")

        replica = self.rng.choice(REPLICAS)
        if self.stale is not None and replica == self.stale_replica:  # it believes it still leads
            self.submit_stale(item, answered)
        elif replica == self.leader and self.engine is not None:
            self.submit(item, answered)
        else:
            # Across replicas it arrives as the wire makes it: maybe asked before (cluster/wire.py).
            relayed = SubmitTask(sub, asked_before=True)
            self.bus(lambda: self.submit(relayed, lambda ok, v: self.bus(lambda: answered(ok, v), "answer")), "ask")

        def unanswered() -> None:
            if ask == task.asks and not task.acked:
                self.ask_to_admit(sub, True)

        self.at(5.0, unanswered, "no answer")

    def cancel_task(self, task_id: str) -> None:
        self.log("api", f"cancel {task_id}")
        self.submit(
            CancelTask(task_id),
            lambda ok, v: None if ok else self.at(1.0, partial(self.cancel_task, task_id), "cancel again"),
        )

    # ------------------------------------------------------------------ running

    def executed(self, device: SimDevice, batch: CommandBatch, call_id: str, tool: str) -> int:
        """A command starts on `device`; returns the token of its execution (`ended` ends it)."""
        node = self.store.table(Node)[(batch.task_id, batch.node_id)]  # as edited, if it was
        spec = NodeSpec.model_validate(node.spec)
        # A fan-out node runs once per device: each child is its own "at most once".
        unit = device.id if spec.for_each is not None else ""
        key = (batch.task_id, batch.node_id, call_id, unit)
        self.executions.setdefault(key, []).append(batch.batch_id)
        self.log("exec", f"{device.id} runs {batch.batch_id} {call_id} {tool}")
        runs = self.executions[key]
        if call_id.startswith("v") and not TOOLS[tool].read_only:
            self.fail(f"verify command {tool} of {batch.task_id}/{batch.node_id} is not read-only")
        if len(runs) > 1:
            ann = TOOLS[tool]
            commands = spec.verify if call_id.startswith("v") else spec.commands
            cmd = commands[int(call_id[1:]) - 1]
            if not (ann.read_only or ann.idempotent or cmd.idempotent):
                self.fail(f"{tool} of {batch.task_id}/{batch.node_id}/{call_id} ran twice: batches {runs}")
        if device.stopped and not read_only(tool):
            self.fail(f"{tool} ran on {device.id}, which applied an emergency stop")
        if device.kill_switch and not harmless(tool):
            self.fail(f"{tool} ran on {device.id} with its owner's kill switch on")
        if tool in NEEDS_APPROVAL:
            rec = next(
                (a for a in device.approvals.values() if (a.batch_id, a.call_id) == (batch.batch_id, call_id)), None
            )
            if rec is None or rec.state != "approved":
                self.fail(f"{tool} of {batch.batch_id}/{call_id} ran without its approval ({rec})")
        node_key = (batch.task_id, batch.node_id, unit)
        if node_key in self.denied:
            self.fail(f"{batch.task_id}/{batch.node_id} ran again after a person denied it")
        # A command that outlived its crashed agent may still run: nothing of its node may start
        # beside it (a retry, or the verify commands of a probe judging it).
        orphans = [(t, d) for t, (k, d, orphan) in sorted(self.active.items()) if k == node_key and orphan]
        if orphans:
            self.fail(f"{batch.task_id}/{batch.node_id} runs on {device.id} while an orphan of it runs: {orphans}")
        token = next(self.tokens)
        self.active[token] = (node_key, device.id, False)
        return token

    def ended(self, token: int) -> None:
        self.active.pop(token, None)

    def orphaned(self, token: int) -> None:
        """Its agent crashed: the command runs on unsupervised until its end or a kill."""
        found = self.active.get(token)
        if found is None:
            return
        self.active[token] = (found[0], found[1], True)
        self.log("orphan", f"{found[1]}: an execution of {found[0]} outlives its agent")
        self.seen["orphan"] += 1
        self.at(self.rng.uniform(0.0, ORPHAN_S), partial(self.ended, token), "orphan ends")

    def kill_orphans(self, device: SimDevice) -> None:
        """The restarted agent kills what its ledger says was running before it reports anything."""
        for token, (key, device_id, orphan) in sorted(self.active.items()):
            if device_id == device.id and orphan:
                self.log("orphan", f"{device_id} kills its orphan of {key}")
                self.seen["orphan killed"] += 1
                del self.active[token]

    def stopped(self, device: SimDevice, gen: int) -> None:
        """The device applies a stop: the store holds that generation or a newer one (a copy sent
        before a resume may arrive after it), and if that one, it says stopped."""
        row = self.store.device(device.id)
        stored = controls_of(row).gen
        if stored < gen or (stored == gen and row.admin_state not in ("stopped", "revoked")):
            self.fail(
                f"{device.id} applied a stop (generation {gen}) the store never held ({row.admin_state}, {stored})"
            )
        self.seen["stop applied"] += 1

    def taken_over(self, device: SimDevice, gen: int) -> None:
        """The device applies an operator's takeover: the store held it at that generation or
        later (a copy sent before a handback may arrive after it)."""
        row = self.store.device(device.id)
        stored = controls_of(row)
        if stored.gen < gen or (stored.gen == gen and not stored.taken_over):
            self.fail(f"{device.id} applied a takeover (generation {gen}) the store never held ({stored})")
        self.seen["takeover applied"] += 1

    def lifted(self, device: SimDevice, state: Any) -> None:
        """Only a resume lifts a stop: the state the device applies must say it was resumed."""
        if state.resumed <= device.stop_gen:
            self.fail(f"{device.id} lifted its stop (generation {device.stop_gen}) with no resume since: {state}")
        self.seen["stop lifted"] += 1

    def decided_at_device(self, device: SimDevice, rec: LApproval) -> None:
        """(The store's side is checked where it is written: `_check_write`.)"""
        who = "owner" if "owner" in rec.by else "orchestrator"
        self.seen[f"approval {rec.state} by {who}"] += 1

    def run(self) -> None:
        n_dev = self.rng.randint(2, 4)
        self.enroll(n_dev)
        self.log("setup", f"seed {self.seed}: {n_dev} devices, faults {self.faults}")
        self.start_engine(REPLICAS[0])
        for dev in self.devices.values():
            dev.connect()
        for _ in range(self.rng.randint(1, 3)):
            self.submissions_due += 1
            self.at(self.rng.uniform(0.0, 20.0), self.submit_task, "submit")
        self.at(0.5, self.tick, "tick")
        self.at(self.settings.link_report_interval_s, self.watch, "link reports")
        self.at(1.0, self.chaos, "chaos")
        self.at(1.0, self.approvals_due, "approvals")
        if self.rng.random() < 0.4:
            self.skew["B"] = self.rng.uniform(0.0, 8.0)  # a replica whose clock is behind
            self.at(self.rng.uniform(0.0, 5.0), self.create_schedule, "schedule")
        end_faults = T0 + self.fault_s
        deadline = T0 + self.fault_s + self.heal_s
        while self.events:
            when, _, fn, _what = heapq.heappop(self.events)
            if when >= end_faults and not self.healing:
                self.heal()
            self.now = max(self.now, when)
            fn()
            if self.healing and self.done():
                break
            if self.now > deadline:
                break
        self.final_checks()

    def heal(self) -> None:
        self.healing = True
        self.faults = QUIET
        self.log("heal", "faults stop")
        for dev in self.devices.values():
            dev.crash_at = None
            dev.kill_switch = False
        if self.schedule_id is not None:
            self.change_schedule(ScheduleAction.PAUSE)
        self.put_back()
        if self.engine is None:
            self._restart_soon()

    def put_back(self) -> None:
        """The operator puts back in service what is not revoked: a resume, then an uncordon (a
        device that breached while stopped comes back cordoned)."""
        for device_id in sorted(self.devices):
            admin = self.store.device(device_id).admin_state
            if admin == "stopped":
                self.control(device_id, "resume")
            elif admin in ("cordoned", "draining"):
                self.control(device_id, "uncordon")
            if controls_of(self.store.device(device_id)).taken_over:
                self.control(device_id, "handback")
            dev = self.devices[device_id]
            if dev.owner_takeover is not None and dev.owner_takeover.taken_over:
                dev.owner_takes_over(False)
        self.at(3.0, self.put_back, "put back")  # a stop asked before the heal may land after it

    def done(self) -> bool:
        if len(self.tasks) == 0 or self.submissions_due:
            return False
        if not all(TaskState(t.state).terminal for t in self.store.tasks()):
            return False
        return all(  # and every decision made at a device has reached the store
            rec.state == "pending"
            or (row := self.store.table(Approval).get((rec.approval_id,))) is None
            or row.state != "pending"
            for dev in self.devices.values()
            for rec in dev.approvals.values()
        )

    # ------------------------------------------------------------------ invariants

    def fail(self, message: str) -> None:
        self.log("VIOLATED", message)
        raise Violation(message)

    def _check_write(self, changes: ChangeSet) -> None:
        """Checked on every write, before it applies: fences only grow in the store (a device's
        fence, and each new attempt's fence on its device); only a resume lifts a stop; the store
        records only an approval decision its device's ledger holds; and after a denial the
        store recorded for an open attempt, that node opens no attempt again."""
        for key, values in changes.updates.get(Device, {}).items():
            if "fence" in values:
                floor = self.device_fence_floor.get(key[0], 0)
                if values["fence"] < floor:
                    self.fail(f"store: fence of {key[0]} goes down {floor} -> {values['fence']}")
                self.device_fence_floor[key[0]] = values["fence"]
            before = self.store.device(key[0]).admin_state
            after = values.get("admin_state", before)
            if before == "stopped" and after not in ("stopped", "revoked") and key[0] not in self.resuming:
                self.fail(f"store: {key[0]} went from stopped to {after} without a resume")
            control = values.get("control") or {}
            if control.get("owner_takeover"):
                self.seen["owner takeover recorded"] += 1
            if after == "stopped" and control.get("taken_over_by"):
                self.fail(f"store: {key[0]} is stopped but still taken over (a stop ends a takeover)")
        for key, values in changes.updates.get(Approval, {}).items():
            state = values.get("state")
            if state is None:
                continue
            row = self.store.table(Approval)[tuple(key)]
            held = self.devices[row.device_id].approvals.get(row.id)
            if held is None or held.state != state:
                self.fail(f"store: approval {row.id} recorded {state}, but its device's ledger holds {held}")
            attempt = self.store.table(Attempt).get((row.batch_id,))
            if state == "denied" and attempt is not None and attempt.ended_at is None:
                spec = NodeSpec.model_validate(self.store.table(Node)[(row.task_id, row.node_id)].spec)
                self.denied.add((row.task_id, row.node_id, row.device_id if spec.for_each is not None else ""))
        for row in changes.inserts.get(Attempt, []):
            # Who has the device when this commit lands (the engine places work after its inputs).
            written = changes.updates.get(Device, {}).get((row["device_id"],), {})
            held = written["control"] if "control" in written else self.store.device(row["device_id"]).control
            held = held or {}
            if row["kind"] != "verify" and (held.get("taken_over_by") or held.get("owner_takeover")):
                self.fail(f"store: {row['batch_id']} opened on {row['device_id']}, which a person has taken over")
            units = {(row["task_id"], row["node_id"], ""), (row["task_id"], row["node_id"], row["device_id"])}
            if units & self.denied and row["kind"] != "verify":
                self.fail(f"store: {row['task_id']}/{row['node_id']} placed again after a person denied it")
            admin = view.admin_state(self.engine, row["device_id"]) if self.engine is not None else "active"
            # Placement runs after every input of the step: it knew. Verify commands are read-only
            # and settle work the device did already, so they run on a device out of service too.
            if admin != "active" and row["kind"] != "verify":
                self.fail(
                    f"store: attempt {row['batch_id']} opened on {row['device_id']}, which the engine knows is {admin}"
                )
            floor = self.attempt_fence_floor.get(row["device_id"], 0)
            if row["fence"] <= floor:
                self.fail(f"store: attempt {row['batch_id']} on {row['device_id']} has fence {row['fence']} <= {floor}")
            self.attempt_fence_floor[row["device_id"]] = row["fence"]

    def check_fences(self, engine: Engine, after_recover: bool = False) -> None:
        for device_id, fence in view.device_fences(engine).items():
            stored = self.store.device(device_id).fence
            floor = max(stored, self.attempt_fence_floor.get(device_id, 0))
            if fence < floor:
                self.fail(f"engine fence of {device_id} is {fence}, below the store's {floor}")

    def check_refused(self) -> None:
        """Results the store refused for their data, in a step the engine survived: their attempt
        ended `input_refused` in that step (memory agreeing with the store is checked next); or,
        when a person had refused one of its commands, with that refusal's code, which wins
        however the attempt ends (`Runs.end_attempt`; neither is ever retried)."""
        refused, self.store.refused = sorted(self.store.refused), set()
        for batch_id in refused:
            row = self.store.table(Attempt).get((batch_id,))
            error = (row.error or {}) if row is not None else {}
            code = error.get("code")
            by_person = code in REFUSALS.values() and "the store refused" in str(error.get("message"))
            if row is None or row.ended_at is None or (code != "input_refused" and not by_person):
                self.fail(
                    f"the store refused the results of {batch_id}, but its attempt is {row and row.status} {code}"
                )
            self.log("refused", f"results of {batch_id}: attempt ended input_refused")
            self.seen["input refused by the store"] += 1
        # The engine's one error log of each refusal is expected; any other error is not.
        self.engine_errors = [e for e in self.engine_errors if not ("refused by the store" in e and POISON in e)]
        if refused:
            self.check_restart_agrees()

    def check_step(self, engine: Engine) -> None:
        self.check_fences(engine)
        if self.engine_errors:
            self.fail(f"the engine logged an error: {self.engine_errors[0]}")
        acked, self.unverified_acks = self.unverified_acks, []
        for batch_id in acked:  # an ended attempt never reopens: each ack is checked once
            row = self.store.table(Attempt).get((batch_id,))
            if row is None or row.ended_at is None:
                self.fail(f"results of {batch_id} were acknowledged but the store has its attempt open")
        tasks = self.store.table(Task)
        for task_id, task in self.tasks.items():
            if task.acked and (task_id,) not in tasks:
                self.fail(f"task {task_id} was acknowledged but is not in the store")
        if self.steps % 50 == 0:
            self.check_restart_agrees()

    def check_restart_agrees(self) -> None:
        """A fresh engine rebuilt from the store (a read-only view) has the live engine's state."""
        live = self.engine
        if live is None:
            return
        probe = Engine(
            self.settings,
            self.store.fork(),  # type: ignore[arg-type]
            _NullBus(),
            clock=lambda: self.now,
            rng=lambda: 0.5,
            ids=lambda prefix: f"probe-{prefix}",
            sleep=_no_sleep,
        )
        probe.planner = _Deaf()
        probe.schedules.load_rows = probe.store.load_schedules  # type: ignore[attr-defined]
        self._run(probe.recover())
        mine, theirs = view.summary(live), view.summary(probe)
        # A task whose TaskCreated hint was lost is in the store and not yet in memory: the live
        # engine adopts it at its next reconcile (by design), so only tasks it knows are compared.
        known = set(view.task_ids(live))
        theirs["tasks"] = {t: s for t, s in theirs["tasks"].items() if t in known}
        if mine != theirs:
            diff = {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}
            self.fail(f"a restart from the store would not rebuild the engine's state: (live, rebuilt) {diff}")

    def final_checks(self) -> None:
        unfinished = [t.id for t in self.store.tasks() if not TaskState(t.state).terminal]
        if unfinished:
            self.fail(f"tasks did not terminate {self.heal_s:g}s after the faults stopped: {unfinished}")
        for device_id, dev in sorted(self.devices.items()):  # every decision reached the store as made
            for rec in dev.approvals.values():
                row = self.store.table(Approval).get((rec.approval_id,))
                if row is not None and rec.state not in ("pending", row.state):
                    self.fail(
                        f"approval {rec.approval_id}: {device_id} decided {rec.state}, the store says {row.state}"
                    )
        ticks: Counter[tuple[str, str]] = Counter()
        for task in self.store.tasks():
            tick = (task.labels or {}).get(TICK_LABEL)
            if tick is not None:
                ticks[(task.labels.get("orrery.schedule", ""), tick)] += 1
                self.seen["schedule tick's task"] += 1
        twice = [t for t, n in ticks.items() if n > 1]
        if twice:
            self.fail(f"schedule ticks made more than one task: {twice}")
        for task in self.store.tasks():
            self.check_dag(task.id)
        self.check_restart_agrees()

    def check_dag(self, task_id: str) -> None:
        """The final node states follow the DAG's rules (checked independently of the domain)."""
        task = self.store.table(Task)[(task_id,)]
        nodes = {n.id: n for n in self.store.table(Node).values() if n.task_id == task_id}
        edges = [e for e in self.store.table(Edge).values() if e.task_id == task_id]
        attempts = [a for a in self.store.table(Attempt).values() if a.task_id == task_id]
        cancelled = task.cancel_requested
        for nid, node in sorted(nodes.items()):
            incoming = [e for e in edges if e.target == nid]
            sat = [_satisfied(e.on, nodes[e.source].state) for e in incoming]
            ran = [a for a in attempts if a.node_id == nid]
            if node.state not in ("succeeded", "failed", "skipped", "cancelled"):
                self.fail(f"{task_id}/{nid} is {node.state} in a task that ended {task.state}")
            if ran and not all(s is True for s in sat):
                self.fail(f"{task_id}/{nid} ran although its edges {[(e.source, e.on) for e in incoming]} were not met")
            if node.state == "skipped" and not any(s is False for s in sat):
                self.fail(f"{task_id}/{nid} was skipped although no edge ruled it out")
            if node.state == "succeeded" and not any(a.status == "succeeded" for a in ran):
                self.fail(f"{task_id}/{nid} succeeded without a succeeded attempt")
            if node.state == "cancelled" and not cancelled:
                self.fail(f"{task_id}/{nid} was cancelled in a task nobody cancelled")
            if any(a.ended_at is None for a in ran):
                self.fail(f"{task_id}/{nid} has an open attempt in a finished task")
        if task.state == "cancelled" and not cancelled:
            self.fail(f"{task_id} ended cancelled, but nobody cancelled it")
        outcomes.check_edge_times(self.fail, task_id, nodes, edges, attempts, max(self.skew.values()))
        children = [c for c in self.store.table(NodeChild).values() if c.task_id == task_id]
        for nid, node in sorted(nodes.items()):
            spec = NodeSpec.model_validate(node.spec)
            ran = [a for a in attempts if a.node_id == nid]
            if spec.for_each is None:
                outcomes.check_verified(self.fail, f"{task_id}/{nid}", node.state, spec, ran, max(self.skew.values()))
                continue
            kids = [c for c in children if c.node_id == nid]
            outcomes.check_fan_out(self.fail, f"{task_id}/{nid}", node, kids, ran, max(self.skew.values()))
            for c in kids:
                own = [a for a in ran if a.device_id == c.device_id]
                outcomes.check_verified(
                    self.fail, f"{task_id}/{nid}@{c.device_name}", c.state, spec, own, max(self.skew.values())
                )

    def report(self) -> str:
        return "\n".join(self.trace.lines)


def _satisfied(on: str, source_state: str) -> bool | None:
    if on == "success":
        return (
            True
            if source_state == "succeeded"
            else (False if source_state in ("failed", "skipped", "cancelled") else None)
        )
    if on == "failure":
        return (
            True
            if source_state == "failed"
            else (False if source_state in ("succeeded", "skipped", "cancelled") else None)
        )
    return (
        True
        if source_state in ("succeeded", "failed")
        else (False if source_state in ("skipped", "cancelled") else None)
    )


def _ignore(fn: Callable[..., Any], *args: Any) -> None:
    fn(*args)


class _NullBus:
    def publish(self, events: list[dict[str, Any]]) -> None:
        pass


class _Deaf(SimPlanner):
    """The planner of an engine rebuilt only to compare its state: it is asked, and never answers."""

    def __init__(self) -> None:
        pass

    def replan(self, task_id: str, node_id: str, context: dict[str, Any]) -> None:
        pass

    def start_planning(self, task_id: str, request: str) -> None:
        pass


# ====================================================================== running one seed


class _ErrorTrap(logging.Handler):
    def __init__(self, world: World) -> None:
        super().__init__(logging.ERROR)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        self.world.engine_errors.append(record.getMessage() + (f" ({record.exc_info[1]!r})" if record.exc_info else ""))


async def _no_sleep(_seconds: float) -> None:
    return None


@contextlib.contextmanager
def _deterministic(world: World) -> Iterator[None]:
    """Engine errors trapped (ids and retry sleeps are handed to each engine it makes)."""
    logger = logging.getLogger("orrery")
    level = logger.level
    trap = _ErrorTrap(world)
    logger.setLevel(logging.ERROR)
    logger.addHandler(trap)
    try:
        yield
    finally:
        logger.removeHandler(trap)
        logger.setLevel(level)


@dataclass
class Outcome:
    seed: int
    ok: bool
    digest: str
    error: str
    trace: str
    steps: int
    events: int
    coverage: Counter[str] = field(default_factory=Counter)  # fan-out and verify paths taken
    terminal: int = 0  # tasks that ended


def simulate(seed: int, fault_s: float = 40.0, heal_s: float = 200.0) -> Outcome:
    world = World(seed, fault_s, heal_s)
    loop = world.loop  # never set as the current loop: nothing in a run really waits on it
    error = ""
    try:
        with _deterministic(world):
            world.run()
    except Violation as exc:
        error = str(exc)
    except Exception as exc:  # the simulator or the engine blew up: report it like a violation
        import traceback

        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        world.log("CRASHED", error.splitlines()[0])
    finally:
        loop.close()
    seen = outcomes.coverage(world.store.table(Node).values(), world.store.table(NodeChild).values())
    seen += world.seen
    ended = sum(1 for t in world.store.tasks() if TaskState(t.state).terminal)
    return Outcome(
        seed, not error, world.trace.digest(), error, world.report(), world.steps, world.trace.count, seen, ended
    )


Reply = Callable[[bool, Any], None]


def _refuse(waiting: list[tuple[Any, Reply | None]]) -> None:
    """Refuse every waiting input: its gateway closes the connection unacknowledged."""
    for _, reply in waiting:
        if reply is not None:
            reply(False, None)


def _answer(futures: list[tuple[Any, Reply | None]]) -> None:
    """Answer each waiting input with its step's outcome: the value, or refused."""
    for fut, reply in futures:
        if reply is None:
            continue
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            reply(True, fut.result())
        else:
            reply(False, None)
