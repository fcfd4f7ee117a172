"""Engine-side mutable records of devices and attempts, and the inputs the engine accepts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from orchestrator.domain.controls import ControlAction, Controls
from orchestrator.domain.edits import EditList
from orchestrator.domain.fanout import child_unit
from orchestrator.domain.model import AdminState, DagSpec, Liveness
from orchestrator.domain.placement import DeviceView
from orchestrator.domain.run import TaskRun
from orchestrator.engine.intake import Submission
from protocol.messages import Command, Message

NodeKey = tuple[str, str]  # (task_id, node_id), or (task_id, unit) for a fan-out child


@dataclass(frozen=True)
class Route:
    """Where a device's current session is: the replica holding it (None: not known yet, ask
    presence) and the connection epoch, below which a session no longer speaks for the device."""

    replica: str | None
    epoch: int


@dataclass(slots=True)
class DeviceRun:
    id: str
    name: str
    labels: dict[str, str]  # enrollment labels
    reported_labels: dict[str, str]
    platform: str
    tools: dict[str, dict[str, Any]]  # name -> ToolSpec as dict
    admin: AdminState
    liveness: Liveness
    fence: int
    current_batch: str | None
    queue: dict[NodeKey, None] = field(default_factory=dict)  # insertion-ordered set
    recovering: bool = False  # connected before an engine (re)start and not heard from since
    # Where its current session lives: the connection epoch (grows with every connection, on
    # any replica) and the replica holding it. Inputs from an older epoch are stale.
    epoch: int = 0
    replica: str | None = None
    heard_at: float | None = None  # engine clock: the last sign of life any replica reported
    token_hash: str = ""  # of its current token: a rotation closes connections made with the old one
    recorded: str | None = None  # the state this engine last wrote to the device's history
    cordon_reason: str | None = None  # why it is cordoned (an operator, or a safety breach)
    # The agent's part of its controls (`orchestrator.domain.controls`): desired state whose
    # generation the agent reports applied; sent again until it does.
    control_gen: int = 0
    stop_reason: str = ""
    resumed_gen: int = 0
    budgets_reset_gen: int = 0
    stopped_at_gen: int = 0
    breach: str | None = None
    applied_gen: int = 0  # what the device last reported applied (hello, heartbeats)
    control_sent_at: float = -1e18  # engine clock: when its control state was last sent
    cancel_sent: tuple[str, float] | None = None  # (batch, when) a cancel was last sent again
    # An operator's takeover (part of its controls, see `Controls`).
    taken_over_by: str | None = None
    takeover_since: float = 0.0
    takeover_reason: str = ""
    takeover_gen: int = 0
    # The owner's takeover at the device, as its agent reports it (the agent is its one writer):
    # {"by", "note", "since", "gen"}, or None.
    owner_takeover: dict[str, Any] | None = None
    features: frozenset[str] = frozenset()  # what its agent announced in its hello

    @property
    def taken_over(self) -> bool:
        """A person has the device (an operator, or its owner at the device): no new work."""
        return self.taken_over_by is not None or self.owner_takeover is not None

    def controls(self) -> Controls:
        return Controls(
            admin=self.admin,
            gen=self.control_gen,
            stop_reason=self.stop_reason,
            resumed=self.resumed_gen,
            budgets_reset=self.budgets_reset_gen,
            stopped_at=self.stopped_at_gen,
            cordon_reason=self.cordon_reason,
            breach=self.breach,
            taken_over_by=self.taken_over_by,
            takeover_since=self.takeover_since,
            takeover_reason=self.takeover_reason,
            takeover_gen=self.takeover_gen,
        )

    def take_controls(self, c: Controls) -> None:
        self.admin, self.control_gen, self.stop_reason = c.admin, c.gen, c.stop_reason
        self.resumed_gen, self.budgets_reset_gen, self.stopped_at_gen = c.resumed, c.budgets_reset, c.stopped_at
        self.cordon_reason, self.breach = c.cordon_reason, c.breach
        self.taken_over_by, self.takeover_since = c.taken_over_by, c.takeover_since
        self.takeover_reason, self.takeover_gen = c.takeover_reason, c.takeover_gen

    def merged_labels(self) -> dict[str, str]:
        """SPEC section 2: enrollment labels win over what the agent reports."""
        return {**self.reported_labels, **self.labels}

    def view(self) -> DeviceView:
        return DeviceView(
            id=self.id,
            name=self.name,
            labels=self.merged_labels(),
            platform=self.platform,
            tools=frozenset(self.tools),
            admin=self.admin,
            liveness=self.liveness,
            busy=self.current_batch is not None or self.taken_over,
            queue_length=len(self.queue),
        )

    @property
    def route(self) -> Route:
        return Route(self.replica, self.epoch)

    def hints(self, tool: str) -> tuple[bool, bool]:
        ann = self.tools.get(tool, {}).get("annotations") or {}
        return bool(ann.get("read_only")), bool(ann.get("idempotent"))


class AttemptKind(StrEnum):
    TOOL = "tool"  # one batch of the node's commands
    AGENT = "agent"  # an LLM step loop holding the device
    STEP = "step"  # one batch of an agent attempt
    VERIFY = "verify"  # a node's read-only verify commands, deciding its outcome


@dataclass(slots=True)
class AttemptRun:
    batch_id: str
    task_id: str
    node_id: str
    n: int
    device_id: str
    fence: int
    commands: list[Command]  # typed when the attempt opens; stored as their JSON
    deadline: float | None
    started: float  # engine clock: when it was dispatched (round-trip metrics)
    accepted: bool = False
    sent: bool = False
    cancel_reason: str | None = None
    kind: AttemptKind = AttemptKind.TOOL
    parent: str | None = None  # a step's agent attempt
    waiter: asyncio.Future[list[dict[str, Any]]] | None = None  # a step's results, for its agent loop
    tools_used: list[str] = field(default_factory=list)  # an agent attempt's tools, for retry safety
    step: str | None = None  # an agent attempt's step batch in flight
    resent_at: float = 0.0  # engine clock: when it was last sent again to a device that lacked it
    waiting_since: float | None = None  # engine clock: its device waits for an approval since then
    paused_since: float | None = None  # engine clock: its device is taken over by a person since then
    # An agent attempt's step asked for while its device was taken over: answered at the handback.
    held: tuple[AgentStep, asyncio.Future[list[dict[str, Any]]]] | None = None
    # An agent attempt whose device was handed back before it asked for its next step: that step
    # is answered with this (nothing of it runs), so the model observes before acting again.
    handback_note: str | None = None
    record: str = "off"  # its screen recording (`orchestrator.domain.recording`); a step shares its agent's
    child: str | None = None  # the device whose fan-out child of `node_id` this runs
    # An approval of it was denied (or expired), as its device confirmed: however the attempt
    # ends now (the device lost, a timeout), it ends with this code, which is never retried.
    refused: str | None = None

    @property
    def key(self) -> NodeKey:
        """(task, unit): the node, or for a fan-out child the child (`fanout.child_unit`)."""
        if self.child is None:
            return (self.task_id, self.node_id)
        return (self.task_id, child_unit(self.node_id, self.child))


# ---------------------------------------------------------------- inputs


@dataclass
class Input:
    done: asyncio.Future[Any] | None = field(default=None, kw_only=True)


@dataclass
class TaskCreated(Input):
    task_id: str
    run: TaskRun | None = None  # the submitting replica hands its parsed task over; others load it


@dataclass
class SubmitTask(Input):
    """A new task from the API (the engine inserts it: it is the one writer of tasks); the reply
    is an `intake.Admission`."""

    submission: Submission
    # It may have been asked before (through another replica, whose answer was lost), so the store
    # may hold it already. A submission made in this process and asked once never is: it skips
    # that lookup on the engine's hot path.
    asked_before: bool = False


@dataclass
class CancelTask(Input):
    task_id: str


@dataclass
class DecideApproval(Input):
    """An operator's decision on an approval, to be asked of its device (the one arbiter). The
    reply (portable across replicas) is {"ok": True} once the request is stored and on its way,
    or {"ok": False, "code": ..., "detail": ..., "state": ...} when it cannot be asked: the
    approval was decided already, its attempt ended, or another decision is on its way. Asked
    again with the same decision it answers alike."""

    approval_id: str
    decision: str  # approved or denied
    by: str
    reason: str = ""


@dataclass
class ControlDevice(Input):
    """An operator's control of a device (drain, cordon, uncordon, stop, resume, revoke): the
    engine is its one writer. The reply (portable) is {"ok": True, "changed": bool} or
    {"ok": False, "code": ..., "detail": ...}. `request_id` makes a request asked again (its
    answer lost between replicas) answer as the first time; `expect_gen` guards a resume or an
    uncordon against controls changed since the operator looked."""

    device_id: str
    action: ControlAction
    reason: str = ""
    request_id: str = ""
    expect_gen: int | None = None
    by: str = ""  # who asks (a takeover's holder)


@dataclass
class DeviceChanged(Input):
    """A device row was created or changed by the API (enrolled, labelled, its token rotated)."""

    device_id: str


@dataclass
class DeviceHello(Input):
    """A device connected (or resumed) on `replica`; `epoch` orders its connections."""

    device_id: str
    hello: Message
    resumed: bool
    epoch: int = 0
    replica: str = ""


@dataclass
class LivenessChanged(Input):
    """What the replica holding connection `epoch` of the device judges of its liveness."""

    device_id: str
    liveness: Liveness
    epoch: int = 0
    replica: str = ""


@dataclass(frozen=True)
class LinkState:
    """One device link as its replica sees it (see `LinkReport`)."""

    device_id: str
    epoch: int
    liveness: Liveness
    silent_s: float  # since the last frame from the device (0 while its frames wait on the engine)
    batch_id: str | None  # the batch the device last said (in a heartbeat) it is running
    control_gen: int = 0  # the control generation the device last said (hello, heartbeat) it applied


@dataclass
class LinkReport(Input):
    """Every link a replica holds, re-announced periodically: the engine's liveness view is
    re-derived from these, so a lost notification only delays it (SPEC section 7)."""

    replica: str
    links: list[LinkState]


@dataclass
class Hearing(Input):
    """Whether the engine can hear other replicas (its Redis subscription is up). While it
    cannot, their devices' silence proves nothing and they are not declared offline."""

    up: bool


@dataclass
class FrameIn(Input):
    device_id: str
    message: Message


@dataclass
class Wake(Input):
    pass


@dataclass
class PlanReady(Input):
    task_id: str
    name: str | None
    spec: DagSpec
    request: str


@dataclass
class PlanFailed(Input):
    task_id: str
    code: str
    message: str


@dataclass(frozen=True)
class ToolCall:
    """One command an agent loop asks for (the engine adds call ids and tool types)."""

    tool: str
    arguments: dict[str, Any]
    timeout_s: float = 60.0


@dataclass
class AgentStep(Input):
    """An agent loop asks for one batch on its device; the reply is a future of the results."""

    attempt_id: str
    commands: list[ToolCall]


@dataclass
class AgentDone(Input):
    attempt_id: str
    succeeded: bool
    output: Any = None
    error_code: str = ""
    error_message: str = ""
    tools_used: list[str] = field(default_factory=list)


@dataclass
class ReplanDone(Input):
    task_id: str
    node_id: str
    edits: EditList | None
    error: str | None = None
