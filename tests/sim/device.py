"""`device_agent` in miniature for the simulation (tests/sim/world.py): its ledger (durable), its
session and executor (lost on a crash), and the people and controls around it.

What it models of the real agent, rule for rule:
- the ledger's batch rules: a batch is recorded before it runs, a redelivered one gets its
  recorded results, a stale fence is refused, a crash reports the running command `uncertain`;
- the device's controls (`device_control`, welcome): a state applied only if its generation is
  newer; a stop kills the running command (`device_stopped`) and refuses every tool that is not
  read-only until a newer state lifts it; a resume lifts it; a budget reset clears the budget;
  the generation applied rides on every heartbeat and hello, and a heartbeat goes at once;
- approvals, with the ledger as the one arbiter: a command of a tool that needs approval is
  recorded and asked for before it runs; the first decision recorded holds, whether the owner's
  (at the device), a request from the orchestrator, or `cancelled` by a cancel or a stop; the
  decision that holds is reported until the server acknowledges it;
- a cancel kills the running command of its batch (the real agent kills its process groups);
- the owner's kill switch refuses every tool that is not harmless; a safety budget (consecutive
  bad outcomes) trips, refuses destructive tools and is reported until a budget reset;
- a command running when the agent crashes is an orphan (its escaped children) that runs on
  until the restarted agent kills it, before it reports anything (`World.kill_orphans`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Literal

from protocol.codec import encode
from protocol.errors import ProtocolError
from protocol.messages import (
    ApprovalDecision,
    ApprovalRequest,
    BatchAccepted,
    Cancel,
    Command,
    CommandBatch,
    ControlState,
    DeviceControl,
    DeviceInfo,
    ErrorInfo,
    Heartbeat,
    Hello,
    Message,
    OwnerTakeover,
    OwnerTakeoverState,
    Result,
    ResultBatch,
    SafetyBreach,
    ToolAnnotations,
    ToolSpec,
    Welcome,
)
from protocol.session import Channel, Session
from tests.sim.memstore import POISON

if TYPE_CHECKING:
    from tests.sim.world import World

TOOLS = {
    "sim.act": ToolAnnotations(destructive=True),  # neither read-only nor idempotent: never twice
    "sim.look": ToolAnnotations(read_only=True),
    "sim.put": ToolAnnotations(idempotent=True),
    "sim.ask": ToolAnnotations(destructive=True),  # waits for a person's approval on every device
}
NEEDS_APPROVAL = frozenset({"sim.ask"})
CRASH_POINTS = ("before_record", "recorded", "ran", "stored")
DECISIONS = ("approved", "denied", "expired", "cancelled")
_REFUSED = {"denied": "approval_denied", "expired": "approval_timeout", "cancelled": "cancelled"}


def read_only(tool: str) -> bool:
    return TOOLS[tool].read_only


def harmless(tool: str) -> bool:
    """What the kill switch lets run (as the router decides it)."""
    ann = TOOLS[tool]
    return ann.read_only or (ann.idempotent and not ann.destructive)


@dataclass
class LBatch:
    fence: int
    frame: CommandBatch
    state: str = "received"  # received, running, done
    calls: dict[str, Result | None] = field(default_factory=dict)  # started (None) or done
    results: list[Result] | None = None


@dataclass
class LApproval:
    """An approval as the device's ledger holds it: the one arbiter of its decision."""

    approval_id: str
    batch_id: str
    call_id: str
    tool: str
    state: str = "pending"
    by: str = ""
    reason: str = ""
    reported: bool = False  # the server acknowledged the decision that holds


@dataclass
class Conn:
    id: int
    device: SimDevice
    replica: str
    server: Channel
    agent: Channel
    open: bool = True
    epoch: int = 0
    inbound: deque[str] = field(default_factory=deque)  # at the gateway, read one at a time
    reading: bool = False  # the gateway's reader waits on the engine


@dataclass
class Running:
    """The command running now; `token` names its execution in the world's records."""

    batch: CommandBatch
    index: int
    results: list[Result]
    token: int


class SimDevice:
    def __init__(self, world: World, device_id: str, tools: list[str], max_bad: int = 0) -> None:
        self.world = world
        self.id = device_id
        self.tools = [ToolSpec(name=t, namespace=t.split(".", 1)[0], annotations=TOOLS[t]) for t in sorted(tools)]
        self.max_bad = max_bad  # the owner's safety budget: consecutive bad outcomes (0: none)
        # durable (the ledger, the kill switch file)
        self.batches: dict[str, LBatch] = {}
        self.outbox: OrderedDict[str, tuple[int, list[Result]]] = OrderedDict()
        self.max_fence = 0
        self.control_gen = 0
        self.stopped = False
        self.stop_gen = 0  # the generation whose state stopped it
        self.approvals: dict[str, LApproval] = {}
        self.kill_switch = False
        self.taken_over = False  # an operator's takeover, as this device applied it
        # The owner's own takeover at the device (this device is its one writer): (taken, gen).
        self.owner_takeover: OwnerTakeoverState | None = None
        # lost on a crash
        self.life = 0
        self.alive = True
        self.session: Session | None = None
        self.conn: Conn | None = None
        self.pending_acks: dict[int, str] = {}
        self.pending_reports: dict[int, str] = {}
        self.in_flight: set[str] = set()
        self.work: list[CommandBatch] = []
        self.current: CommandBatch | None = None
        self.cancelling: set[str] = set()
        self.running: Running | None = None
        self.waits: dict[str, tuple[CommandBatch, int, list[Result]]] = {}  # approval id -> where it waits
        self.bad_streak = 0
        self.tripped = False
        self.last_server_frame = 0.0
        self.crash_at: str | None = None
        self.connecting = False

    def log(self, text: str) -> None:
        self.world.log("device", f"{self.id} {text}")

    # ------------------------------------------------------------------ process

    def later(self, delay: float, fn: Callable[[], None], what: str) -> None:
        life = self.life

        def run() -> None:
            if self.alive and self.life == life:
                fn()

        self.world.at(delay, run, f"{self.id} {what}")

    def maybe_crash(self, point: str) -> bool:
        if self.crash_at != point:
            return False
        self.crash_at = None
        self.crash(f"at ledger point '{point}'")
        return True

    def crash(self, why: str) -> None:
        self.log(f"CRASH {why}")
        if self.running is not None:  # its escaped children run on, unsupervised
            self.world.orphaned(self.running.token)
        self.alive = False
        self.life += 1
        if self.conn is not None:
            self.world.close_conn(self.conn, "device crashed")
        self.session, self.conn, self.pending_acks, self.pending_reports = None, None, {}, {}
        self.work, self.current, self.cancelling, self.running, self.waits = [], None, set(), None, {}
        self.in_flight, self.bad_streak, self.tripped = set(), 0, False
        self.connecting = False
        self.world.at(self.world.rng.uniform(0.5, 4.0), self.restart, f"{self.id} restart")

    def restart(self) -> None:
        """Kill what the last run left behind, then `ledger.recover()`: a running batch ends
        uncertain/skipped; unstarted past-deadline ones end deadline_passed; others wait for a
        redelivery (a batch waiting for an approval waits on)."""
        self.alive = True
        self.world.kill_orphans(self)
        now = self.world.now
        for bid, b in self.batches.items():
            running = any(r is None for r in b.calls.values())
            asked = any(a.batch_id == bid and a.call_id not in b.calls for a in self.approvals.values())
            if asked and not running:
                continue  # waiting for (or decided on) an approval: it goes on when redelivered
            if b.state == "running":
                results: list[Result] = []
                for cmd in b.frame.commands:
                    done = b.calls.get(cmd.call_id)
                    if done is not None:
                        results.append(done)
                    elif cmd.call_id in b.calls:
                        results.append(_result(cmd.call_id, cmd.tool, "uncertain", "uncertain"))
                    else:
                        results.append(_result(cmd.call_id, cmd.tool, "skipped", "skipped"))
                self.finish(bid, results)
            elif b.state == "received" and b.frame.deadline is not None and b.frame.deadline.timestamp() <= now:
                self.finish(bid, _none_ran(b.frame, "timeout"))
        self.log("restarted")
        self.connect()

    # ------------------------------------------------------------------ connection

    def connect(self) -> None:
        if not self.alive or self.conn is not None or self.connecting:
            return
        self.connecting = True
        self.later(self.world.rng.uniform(0.2, 2.0), self._dial, "dial")

    def _dial(self) -> None:
        self.connecting = False
        if self.conn is not None:
            return
        replica = self.world.rng.choice(("A", "B"))
        conn = self.world.open_conn(self, replica)
        self.conn = conn
        self.last_server_frame = self.world.now
        resume = self.session.resume_point() if self.session is not None else None
        hello = Hello(
            device_id=self.id,
            versions=[1],
            info=DeviceInfo(platform="linux"),
            tools=self.tools,
            resume=resume,
            fence_seen=self.max_fence,
            control_gen=self.control_gen,
            owner_takeover=self.owner_takeover,
        )
        self.world.to_server(conn, conn.agent.send(hello))
        self.later(self.world.settings.heartbeat_interval_s, partial(self._beat, conn), "heartbeat")

    def lost(self, conn: Conn) -> None:
        if self.conn is conn:
            self.conn = None
            self.connect()

    def _beat(self, conn: Conn) -> None:
        if self.conn is not conn or not conn.open:
            return
        if self.world.now - self.last_server_frame > self.world.settings.heartbeat_timeout_s:
            self.world.close_conn(conn, "server silent")
            return
        if conn.agent.session is not None:
            self.heartbeat()
        self.later(self.world.settings.heartbeat_interval_s, partial(self._beat, conn), "heartbeat")

    def heartbeat(self) -> None:
        batch = self.current.batch_id if self.current else None
        self.send(Heartbeat(state="busy" if batch else "idle", batch_id=batch, control_gen=self.control_gen))

    def send(self, message: Message) -> None:
        if self.session is None:
            return
        stamped = self.session.stamp(message)
        if isinstance(stamped, ResultBatch):
            self.pending_acks[stamped.seq] = stamped.batch_id
        elif isinstance(stamped, ApprovalDecision):
            self.pending_reports[stamped.seq] = stamped.approval_id
            self.in_flight.add(stamped.approval_id)
        conn = self.conn
        if conn is not None and conn.open and conn.agent.session is self.session:
            self.world.to_server(conn, encode(stamped))

    def receive(self, conn: Conn, data: str) -> None:
        if self.conn is not conn or not conn.open:
            return
        self.last_server_frame = self.world.now
        try:
            msg = conn.agent.receive(data)
        except ProtocolError as exc:
            self.log(f"protocol error {exc.code}: {exc}")
            self.world.close_conn(conn, f"agent protocol error {exc.code}")
            return
        if isinstance(msg, Welcome):
            if msg.control is not None:
                self.apply_control(msg.control)
            self._open(conn, msg)
            return
        self._settle_acks()
        if msg is None:
            return
        assert self.session is not None
        if isinstance(msg, CommandBatch):
            self._on_batch(msg)
        elif isinstance(msg, Cancel):
            self.session.confirm(msg.seq)
            self.cancel(msg.batch_id)
        elif isinstance(msg, DeviceControl):
            self.apply_control(msg.control)
            self.session.confirm(msg.seq)
        elif isinstance(msg, ApprovalDecision):
            self.session.confirm(msg.seq)
            self.asked_to_decide(msg)

    def _open(self, conn: Conn, welcome: Welcome) -> None:
        if self.session is not None and self.session.resumed_by(welcome):
            for frame in conn.agent.open_agent(welcome, self.session):  # what the server lacks
                self.world.to_server(conn, frame)
            return
        self.session = Session(welcome.session_id, welcome.version)
        conn.agent.open_agent(welcome, self.session)
        self.pending_acks, self.pending_reports, self.in_flight = {}, {}, set()
        for bid, (fence, results) in self.outbox.items():
            stamped = self.session.stamp(ResultBatch(batch_id=bid, fence=fence, results=results))
            self.pending_acks[stamped.seq] = bid
            self.world.to_server(conn, encode(stamped))
        # A new session carries every request still pending and every decision not acknowledged
        # (their frames of the last session were dropped with it), and the breach until reset.
        for rec in sorted(self.approvals.values(), key=lambda a: a.approval_id):
            if rec.state == "pending":
                self.send(self._request(rec))
            elif not rec.reported and rec.approval_id not in self.in_flight:
                self.send(self._report(rec))
        if self.tripped:
            self.send(SafetyBreach(budget="consecutive_bad_outcomes", limit=self.max_bad, detail="sim"))

    def _settle_acks(self) -> None:
        if self.session is None:
            return
        for seq in sorted(s for s in self.pending_acks if s <= self.session.peer_ack):
            self.outbox.pop(self.pending_acks.pop(seq), None)
        for seq in sorted(s for s in self.pending_reports if s <= self.session.peer_ack):
            approval_id = self.pending_reports.pop(seq)
            self.in_flight.discard(approval_id)
            rec = self.approvals.get(approval_id)
            if rec is not None and rec.state != "pending":
                rec.reported = True

    # ------------------------------------------------------------------ controls

    def apply_control(self, state: ControlState) -> None:
        if state.gen <= self.control_gen:
            return  # sent again, or an older copy
        before, was = self.control_gen, self.stopped
        self.log(f"applies control generation {state.gen} (stopped={state.stopped})")
        if not state.stopped and was:
            self.world.lifted(self, state)
        if not state.stopped and not was and state.stopped_at > before:
            self._kill("device_stopped")  # stopped and resumed since it last heard: the stop still ends it
            self.world.seen["stop and resume heard together"] += 1
        if state.taken_over and not self.taken_over:
            self.world.taken_over(self, state.gen)
        self.taken_over = state.taken_over
        self.control_gen, self.stopped = state.gen, state.stopped  # durable before acting on it
        if state.stopped and not was:
            self.stop_gen = state.gen
            self.world.stopped(self, state.gen)
            self._kill("device_stopped")
            if self.current is not None:
                self._wake(self.current.batch_id, "stopped")
        if state.budgets_reset > before:
            self.bad_streak, self.tripped = 0, False
        self.heartbeat()

    def owner_takes_over(self, taken: bool) -> None:
        """The owner takes the device over at the device, or hands it back (its ledger first)."""
        gen = (self.owner_takeover.gen if self.owner_takeover is not None else 0) + 1
        self.owner_takeover = OwnerTakeoverState(taken_over=taken, by="owner", note="owner's note", gen=gen)
        self.log(f"owner {'takes the device over' if taken else 'hands it back'} (generation {gen})")
        self.send(OwnerTakeover(state=self.owner_takeover))  # reliable: waits in the session while away

    # ------------------------------------------------------------------ approvals (the ledger arbitrates)

    def decide(self, approval_id: str, state: str, by: str) -> bool:
        """Record a decision if none was recorded first (the ledger's compare-and-set)."""
        rec = self.approvals.get(approval_id)
        if rec is None or rec.state != "pending":
            return False
        rec.state, rec.by, rec.reported = state, by, False
        self.log(f"approval {approval_id} {state} by {by}")
        self.world.decided_at_device(self, rec)
        wait = self.waits.pop(approval_id, None)
        if wait is not None:  # the waiting command reports what holds, then goes on
            self.send(self._report(rec))
            batch, i, results = wait
            self.later(0.0, partial(self._command, batch, i, results), f"decided {approval_id}")
        return True

    def owner_decides(self, approval_id: str, state: str) -> None:
        """`orrery agent approve|deny ID` at the device."""
        self.decide(approval_id, state, "device owner (at the device)")

    def asked_to_decide(self, msg: ApprovalDecision) -> None:
        rec = self.approvals.get(msg.approval_id)
        if rec is None:
            if msg.decision == "cancelled":  # not kept here: confirm what was asked
                self.send(ApprovalDecision(approval_id=msg.approval_id, decision="cancelled", by=msg.by))
            return
        if rec.state == "pending":
            waiting = rec.approval_id in self.waits
            self.decide(rec.approval_id, msg.decision, msg.by or "orchestrator")
            if not waiting:
                self.send(self._report(rec))
            return
        if rec.state != msg.decision:
            self.world.seen["approval race: the device's decision held"] += 1
        self.send(self._report(rec))  # decided first by someone else: what holds

    def _request(self, rec: LApproval) -> ApprovalRequest:
        return ApprovalRequest(approval_id=rec.approval_id, batch_id=rec.batch_id, call_id=rec.call_id, tool=rec.tool)

    def _report(self, rec: LApproval) -> ApprovalDecision:
        return ApprovalDecision(approval_id=rec.approval_id, decision=rec.state, by=rec.by)  # type: ignore[arg-type]

    def _wake(self, batch_id: str, why: str) -> None:
        """A cancel or a stop: a command of the batch waiting for approval stops waiting now."""
        for approval_id, (batch, _i, _r) in sorted(self.waits.items()):
            if batch.batch_id == batch_id:
                self.decide(approval_id, "cancelled", f"orchestrator ({why})")

    # ------------------------------------------------------------------ batches (ledger rules)

    def _on_batch(self, batch: CommandBatch) -> None:
        if self.maybe_crash("before_record"):
            return
        known = self.batches.get(batch.batch_id)
        assert self.session is not None
        if known is None and batch.fence < self.max_fence:
            self.session.confirm(batch.seq)
            self.log(f"refuses stale {batch.batch_id} f{batch.fence} < {self.max_fence}")
            results = _none_ran(batch, "stale_fence")
            self.send(
                ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=results, fence_seen=self.max_fence)
            )
            return
        if known is None:
            self.batches[batch.batch_id] = LBatch(batch.fence, batch)
            self.max_fence = max(self.max_fence, batch.fence)
        self.session.confirm(batch.seq)
        if known is not None and known.state == "done":
            self.send(ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=known.results or []))
            return
        if known is None and self.maybe_crash("recorded"):
            return
        self.send(BatchAccepted(batch_id=batch.batch_id))
        running = self.current is not None and self.current.batch_id == batch.batch_id
        if not running and all(b.batch_id != batch.batch_id for b in self.work):
            self.work.append(batch)
            self._next()

    def cancel(self, batch_id: str) -> None:
        rec = self.batches.get(batch_id)
        if rec is not None and rec.state == "done":
            return  # finished already: a cancel sent again changes nothing
        self.cancelling.add(batch_id)
        if self.running is not None and self.running.batch.batch_id == batch_id:
            self._kill("cancelled")
        self._wake(batch_id, "cancelled")

    def _next(self) -> None:
        while self.current is None and self.work:
            batch = self.work.pop(0)
            rec = self.batches[batch.batch_id]
            if rec.state == "done":
                continue
            waited = any(a.batch_id == batch.batch_id for a in self.approvals.values())
            if batch.deadline is not None and batch.deadline.timestamp() <= self.world.now and not waited:
                self.finish(batch.batch_id, _none_ran(batch, "timeout"))
                self.send(ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=rec.results or []))
                continue
            self.current = batch
            done = {c: r for c, r in rec.calls.items() if r is not None}  # ran before a restart
            self._command(batch, 0, [], done)

    def _command(
        self, batch: CommandBatch, i: int, results: list[Result], done: dict[str, Result] | None = None
    ) -> None:
        rec = self.batches[batch.batch_id]
        if i == len(batch.commands):
            self.current = None
            self.cancelling.discard(batch.batch_id)
            if self.maybe_crash("ran"):
                return
            self.finish(batch.batch_id, results)
            if self.maybe_crash("stored"):
                return
            self.send(ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=results))
            self._next()
            return
        cmd = batch.commands[i]
        if done and cmd.call_id in done:
            results.append(done[cmd.call_id])
            self._command(batch, i + 1, results, done)
            return
        skip = self._skip(batch, cmd, results)
        if skip is not None:
            results.append(skip)
            self._command(batch, i + 1, results, done)
            return
        if cmd.tool in NEEDS_APPROVAL:
            approval = self._approval(batch, cmd)
            if approval.state == "pending":
                self.waits[approval.approval_id] = (batch, i, results)
                return  # `decide` goes on from here
            if approval.approval_id not in self.in_flight and not approval.reported:
                self.send(self._report(approval))
            if approval.state != "approved" or batch.batch_id in self.cancelling or self.stopped:
                code = "device_stopped" if self.stopped else _REFUSED.get(approval.state, "cancelled")
                if approval.state == "approved" and batch.batch_id in self.cancelling:
                    code = "cancelled"
                results.append(_result(cmd.call_id, cmd.tool, "failure", code))
                self._outcome("failure")
                self._command(batch, i + 1, results, done)
                return
        rec.state = "running"
        rec.calls[cmd.call_id] = None
        token = self.world.executed(self, batch, cmd.call_id, cmd.tool)
        failed = self.world.rng.random() < self.world.faults.tool_failure
        result = (
            _result(cmd.call_id, cmd.tool, "failure", "tool_error")
            if failed
            else Result(call_id=cmd.call_id, status="success", result={"ok": True})
        )
        if not failed and self.world.poisoned_output():  # text the store cannot hold
            result = Result(call_id=cmd.call_id, status="success", result={"ok": True, "note": POISON})
        self.running = Running(batch, i, results, token)

        def finished() -> None:
            if self.running is None or self.running.token != token:
                return  # killed meanwhile
            self.running = None
            self.world.ended(token)
            rec.calls[cmd.call_id] = result
            results.append(result)
            self._outcome(result.status)
            self._command(batch, i + 1, results, done)

        self.later(self.world.rng.uniform(0.1, 3.0), finished, f"runs {batch.batch_id}/{cmd.call_id}")

    def _skip(self, batch: CommandBatch, cmd: Command, results: list[Result]) -> Result | None:
        """Why the command does not run (None: it may): an earlier one failed, a cancel, a stop,
        the kill switch, the safety budget."""
        call_id, tool = cmd.call_id, cmd.tool
        if batch.batch_id in self.cancelling or (results and results[-1].status != "success"):
            return _result(call_id, tool, "skipped", "skipped")
        if self.stopped and not read_only(tool):
            return _result(call_id, tool, "skipped", "device_stopped")
        if self.kill_switch and not harmless(tool):
            self.world.seen["kill switch refused"] += 1
            self._outcome("failure")
            return _result(call_id, tool, "failure", "policy_denied")
        if self.tripped and TOOLS[tool].destructive:
            return _result(call_id, tool, "failure", "budget_exceeded")
        return None

    def _approval(self, batch: CommandBatch, cmd: Command) -> LApproval:
        call_id, tool = cmd.call_id, cmd.tool
        rec = next((a for a in self.approvals.values() if (a.batch_id, a.call_id) == (batch.batch_id, call_id)), None)
        if rec is None:
            rec = LApproval(self.world.new_id("apr"), batch.batch_id, call_id, tool)
            self.approvals[rec.approval_id] = rec  # in the ledger before the request goes out
            self.log(f"asks approval {rec.approval_id} for {batch.batch_id}/{call_id}")
            self.world.owner_may_decide(self, rec.approval_id)
        if rec.state == "pending":
            self.send(self._request(rec))
        return rec

    def _kill(self, code: str) -> None:
        """Kill the running command (its process group): it ends now, failed with `code`."""
        run = self.running
        if run is None:
            return
        self.running = None
        self.world.ended(run.token)
        cmd = run.batch.commands[run.index]
        result = _result(cmd.call_id, cmd.tool, "failure", code)
        self.batches[run.batch.batch_id].calls[cmd.call_id] = result
        run.results.append(result)
        self.later(0.0, partial(self._command, run.batch, run.index + 1, run.results), f"killed {cmd.call_id}")

    def _outcome(self, status: str) -> None:
        """The owner's safety budget: consecutive bad outcomes trip it."""
        if not self.max_bad:
            return
        self.bad_streak = 0 if status == "success" else self.bad_streak + 1
        if self.bad_streak >= self.max_bad and not self.tripped:
            self.tripped = True
            self.world.seen["safety budget tripped"] += 1
            self.log("safety budget tripped")
            self.send(SafetyBreach(budget="consecutive_bad_outcomes", limit=self.max_bad, detail="sim"))

    def finish(self, batch_id: str, results: list[Result]) -> None:
        rec = self.batches[batch_id]
        rec.state, rec.results, rec.calls = "done", results, {}
        self.outbox[batch_id] = (rec.fence, results)


def _result(call_id: str, tool: str, status: Literal["failure", "skipped", "uncertain"], code: str) -> Result:
    return Result(
        call_id=call_id,
        status=status,
        namespace=tool.split(".", 1)[0],
        error=ErrorInfo(code=code, message=f"simulated {code}"),
    )


def _none_ran(batch: CommandBatch, code: str) -> list[Result]:
    return [_result(c.call_id, c.tool, "skipped", code) for c in batch.commands]
