"""Every frame of the device protocol as a frozen pydantic model (SPEC section 4).

One discriminated union, `Message`, keyed by `type`. Reliable frames (numbered by `seq`) are
listed in `RELIABLE_TYPES`; the others carry `seq: 0`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from protocol.text import IDENT, PAYLOAD

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS: tuple[int, ...] = (1,)

# Every string a device sends is checked by `protocol.text.inbound` (the server's channel does it):
# IDENT and PAYLOAD name the kind of a field; the rest is free text. Lengths bound what is stored.
Identifier = Annotated[str, Field(min_length=1, max_length=200), IDENT]
ApprovalId = Annotated[str, Field(min_length=1, max_length=64), IDENT]  # the store's key column
ShortText = Annotated[str, Field(max_length=200)]
MAX_STOP_REASON_CHARS = 200  # an operator's reason for an emergency stop (API limit)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Frame(_Model):
    # Strict: the envelope names its version with a JSON integer, never "1", 1.0 or true (the
    # codec refuses those before the schema too; see `protocol.codec.decode`).
    v: Annotated[int, Strict()] = Field(default=PROTOCOL_VERSION, ge=1)
    seq: int = Field(default=0, ge=0)
    ack: int = Field(default=0, ge=0)


# ---------------------------------------------------------------- payload parts


class ToolAnnotations(_Model):
    read_only: bool = False
    idempotent: bool = False
    destructive: bool = False


class ToolSpec(_Model):
    """One entry of a device's tool catalogue (SPEC section 2, Tool)."""

    name: Identifier  # namespace.tool
    namespace: Identifier
    description: str = Field(default="", max_length=32_768)
    input_schema: dict[str, Any] = Field(default_factory=dict)
    annotations: ToolAnnotations = ToolAnnotations()
    tool_type: Literal["data_collection", "action"] = "action"


class DeviceInfo(_Model):
    model_config = ConfigDict(frozen=True, extra="allow")

    platform: Literal["linux", "windows", "macos", "android", "ios", "other"] = "other"
    os: ShortText = ""
    version: ShortText = ""
    hostname: ShortText = ""
    cpu_count: int = 0
    memory_mb: int = 0
    agent_version: ShortText = ""


class Resume(_Model):
    session_id: Identifier
    last_seq: int = Field(ge=0)


class Command(_Model):
    call_id: Identifier
    tool: Identifier
    tool_type: Literal["data_collection", "action"] = "action"
    arguments: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(default=60.0, gt=0)


class ErrorInfo(_Model):
    # Both as the device says them: the orchestrator records a code it does not know as
    # `device_error`, quoting it reduced to safe characters (`protocol.errors.bounded_result_error`).
    code: Annotated[str, PAYLOAD]
    message: Annotated[str, PAYLOAD]  # what the tool said: stored as JSON, capped on the way in


ResultStatus = Literal["success", "failure", "skipped", "uncertain"]


class Result(_Model):
    call_id: Identifier
    status: ResultStatus
    result: Annotated[Any, PAYLOAD] = None
    error: ErrorInfo | None = None
    namespace: Annotated[str, Field(max_length=200), IDENT] = ""
    duration_ms: float = 0.0


class ControlState(_Model):
    """What operators want of the device itself, as one piece of desired state with a generation
    (level-triggered, as in Kubernetes): the server sends it until the agent reports (in its
    heartbeats and hellos) that it has applied this generation, so a lost frame only delays it.
    `gen` grows with every change; an agent applies a state whose `gen` is above the one its
    ledger holds and ignores older ones, so copies sent again or out of order change nothing."""

    gen: int = Field(ge=0)
    # Emergency stop: the agent kills what runs and refuses every action tool until a newer
    # state says not stopped. Only an operator's resume lowers it.
    stopped: bool = False
    reason: str = Field(default="", max_length=MAX_STOP_REASON_CHARS * 2)
    # The generation of the last resume: an agent applying a newer one lifts its stop latch even
    # if it was not stopped (a model's own `gui.stop`, which no tool can lift).
    resumed: int = Field(default=0, ge=0)
    # The generation of the last budget reset (an operator uncordoned the device): an agent
    # applying a newer one clears its safety budgets.
    budgets_reset: int = Field(default=0, ge=0)
    # The generation of the last stop: an agent that has not applied it kills what runs, even if a
    # resume came since (a stop and a resume it hears of together still end the running command).
    stopped_at: int = Field(default=0, ge=0)
    # An operator has taken the device over (the live view's pointer and keys are theirs): the
    # agent voids its GUI observation and refuses the model's input tools (`taken_over`) until a
    # newer state hands the device back; it voids the observation again then, so the model must
    # observe afresh. `takeover_gen`: the generation of the last takeover.
    taken_over: bool = False
    takeover_by: str = Field(default="", max_length=200)
    takeover_gen: int = Field(default=0, ge=0)


class OwnerTakeoverState(_Model):
    """The owner's takeover at the device, as its agent holds it (see `OwnerTakeover`)."""

    taken_over: bool
    note: str = Field(default="", max_length=2000)
    by: str = Field(default="", max_length=200)
    since: datetime | None = None
    # Grows with every change the owner makes, so the server keeps the newest whatever the order.
    gen: int = Field(default=0, ge=0)


# ---------------------------------------------------------------- frames


class Hello(_Frame):
    type: Literal["hello"] = "hello"
    device_id: Identifier
    agent_version: ShortText = ""
    versions: list[int] = Field(min_length=1, max_length=16)
    info: DeviceInfo = DeviceInfo()
    labels: dict[str, ShortText] = Field(default_factory=dict, max_length=64)
    tools: list[ToolSpec] = Field(default_factory=list)
    resume: Resume | None = None
    # The highest fence the agent's ledger accepted for this device from this server. A server
    # whose own counter is lower (its database was restored from a backup) raises it past this
    # before assigning anything, so its next batch is not refused as stale.
    fence_seen: int = Field(default=0, ge=0)
    # The generation of the device's controls its ledger has applied (see `ControlState`).
    control_gen: int = Field(default=0, ge=0)
    # What this agent can do beyond the base protocol (`FEATURES`): the server sends a frame of a
    # feature only to an agent that announced it, and refuses the API call that needs it otherwise.
    features: list[Annotated[str, Field(max_length=64), IDENT]] = Field(default_factory=list, max_length=64)
    # The owner's own takeover at the device (`orrery agent takeover`), as the agent holds it now.
    owner_takeover: OwnerTakeoverState | None = None


class Welcome(_Frame):
    type: Literal["welcome"] = "welcome"
    session_id: Identifier
    version: int
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    max_frame_bytes: int
    resumed: bool
    # Names the orchestrator's store (the same on every replica and across restarts): the agent
    # binds its ledger's fence high-water mark to (server_id, device_id).
    server_id: str | None = Field(default=None, max_length=200)
    # The server's clock when it sent this: batch deadlines are in the server's time, so the
    # agent measures its offset here and judges deadlines by it (device clocks drift).
    server_time: datetime | None = None
    # The device's controls (emergency stop, budget reset, resume) as operators want them: an agent
    # that was away when they changed converges at every welcome, before anything else happens.
    # None: the server does not say; the agent keeps what its ledger holds.
    control: ControlState | None = None


class Heartbeat(_Frame):
    """Agent to server every heartbeat interval. The server answers each with a heartbeat of
    its own, which carries its `ack` (so the agent can trim its outbox) and proves the server
    alive; `state` there is the device state the server holds."""

    type: Literal["heartbeat"] = "heartbeat"
    state: Literal["idle", "busy"]
    batch_id: Annotated[str, IDENT] | None = None  # compared, never stored: the frame bounds it
    # Agent to server: the generation of the device's controls the agent has applied (its
    # ledger's), so the server sends the controls again until the device has caught up.
    control_gen: int = Field(default=0, ge=0)


class CommandBatch(_Frame):
    type: Literal["command_batch"] = "command_batch"
    batch_id: Identifier
    task_id: Identifier
    node_id: Identifier
    attempt: int = Field(ge=1)
    fence: int = Field(ge=1)
    deadline: datetime | None = None
    early_exit: bool = True
    commands: list[Command] = Field(min_length=1)
    # Record the screen while this batch runs (an agent that announced `record`): "failures"
    # keeps the recording only if the server's `recording_end` says so (the attempt failed, was
    # uncertain or cancelled), "always" keeps it whatever happens. One recording per attempt
    # (task, node, attempt), across the step batches of an agent node.
    record: Literal["off", "failures", "always"] = "off"


class BatchAccepted(_Frame):
    type: Literal["batch_accepted"] = "batch_accepted"
    batch_id: Identifier


class ResultBatch(_Frame):
    type: Literal["result_batch"] = "result_batch"
    batch_id: Identifier
    fence: int = Field(ge=1)
    results: list[Result]
    # Set when the agent refused the batch without running it (every result `skipped`, error
    # `stale_fence`): the highest fence its ledger has seen, so the server can assign above it.
    fence_seen: int = Field(default=0, ge=0)


class Cancel(_Frame):
    type: Literal["cancel"] = "cancel"
    batch_id: Identifier
    reason: str = ""


class ToolsChanged(_Frame):
    type: Literal["tools_changed"] = "tools_changed"
    tools: list[ToolSpec]


# ---------------------------------------------------------------- approvals


class ApprovalRequest(_Frame):
    """Agent to server: a command needs a person's approval before it runs (the tool is in the
    agent's `approval_required`, or it is `approval.request`). Sent again, unchanged, after every
    reconnect until the approval is decided. Nothing of the command has run."""

    type: Literal["approval_request"] = "approval_request"
    approval_id: ApprovalId
    batch_id: Identifier
    call_id: Identifier
    tool: Identifier
    arguments: dict[str, Any] = Field(default_factory=dict)
    reason: str = Field(default="", max_length=2000)
    # The device owner requires that approvals for this device are given on the device itself
    # (`orrery agent approve ID`): the orchestrator shows the request but cannot decide it.
    local_only: bool = False
    # For a GUI action: the screenshot of the observation it was planned on (PNG, base64).
    screenshot_png_b64: str | None = None


class ApprovalDecision(_Frame):
    """The device's ledger is the one arbiter of an approval. Server to agent: a decision asked
    of the device (an operator's, the expiry, or `cancelled` when its attempt ended), sent again
    until the device confirms it; the ledger takes it only if nothing was decided first. Agent to
    server: the decision that holds, whoever made it (the owner at the device, or a request the
    ledger took), sent until the server acknowledges it; only then is it recorded there.
    `deadline` (agent to server): the batch's deadline moved on by the time the command waited
    (server time), so it still gets its whole timeout."""

    type: Literal["approval_decision"] = "approval_decision"
    approval_id: ApprovalId
    decision: Literal["approved", "denied", "expired", "cancelled"]
    reason: str = Field(default="", max_length=2000)
    by: str = Field(default="", max_length=200)
    deadline: datetime | None = None


class Error(_Frame):
    type: Literal["error"] = "error"
    code: Annotated[str, Field(max_length=200), IDENT]
    message: str


# ---------------------------------------------------------------- safety budgets

SafetyBudget = Literal["destructive_per_minute", "consecutive_bad_outcomes"]


class SafetyBreach(_Frame):
    """Agent to server: the device refused work because one of its owner's safety budgets was
    breached. The server cordons the device with this as the reason (a stopped device stays
    stopped; the breach is recorded). Sent again on every new session until a control state
    with a newer `budgets_reset` arrives."""

    type: Literal["safety_breach"] = "safety_breach"
    budget: SafetyBudget
    limit: int = Field(ge=1)
    detail: str = Field(default="", max_length=1000)


# ---------------------------------------------------------------- controls


class DeviceControl(_Frame):
    """Server to agent: the device's control state (`ControlState`), sent whenever it changes and
    again until the agent's heartbeats report its generation applied."""

    type: Literal["device_control"] = "device_control"
    control: ControlState


# ---------------------------------------------------------------- live view and takeover

FEATURE_VIEW = "view"  # live view frames, forwarded input
FEATURE_RECORD = "record"  # screen recordings of attempts (`CommandBatch.record`, `recording_end`)
FEATURES: tuple[str, ...] = (FEATURE_VIEW, FEATURE_RECORD)
MAX_VIEW_IMAGE_B64 = 4_000_000


class View(_Frame):
    """Server to agent: someone watches the device's screen. A lease: the agent sends frames of
    `stream_id` at most `fps` a second while copies keep coming within `lease_s` (the server sends
    one every few seconds while a viewer is attached), and stops on its own when they stop, so a
    viewer that went away, or a replica that died, never leaves a device streaming. `on: false`
    ends the stream at once."""

    type: Literal["view"] = "view"
    stream_id: Identifier
    on: bool = True
    fps: float = Field(default=2.0, gt=0, le=15)
    max_side: int = Field(default=1280, ge=64, le=4096)
    quality: int = Field(default=70, ge=10, le=95)
    marks: bool = False  # draw the element marks of the last GUI observation
    lease_s: float = Field(default=10.0, gt=0, le=60)


class ViewMark(_Model):
    """An element of the last observation, as a box in the frame's pixels."""

    id: int = Field(ge=0)
    name: str = Field(default="", max_length=200)
    x: int
    y: int
    w: int = Field(ge=0)
    h: int = Field(ge=0)


class ViewFrame(_Frame):
    """Agent to server: one frame of a view stream (never numbered: a lost frame is replaced by
    the next)."""

    type: Literal["view_frame"] = "view_frame"
    stream_id: Identifier
    n: int = Field(ge=1)
    source: Literal["x11", "browser"]
    mime: Literal["image/jpeg", "image/png"] = "image/jpeg"
    image_b64: str = Field(max_length=MAX_VIEW_IMAGE_B64)
    width: int = Field(ge=1)  # of the image: the coordinate space of forwarded input
    height: int = Field(ge=1)
    screen_width: int = Field(ge=1)
    screen_height: int = Field(ge=1)
    marks: list[ViewMark] = Field(default_factory=list, max_length=2000)


ViewEndCode = Literal["watch_disallowed", "no_screen", "lease_expired", "ended", "error"]


class ViewEnded(_Frame):
    """Agent to server: the stream ended or was refused (`watch_disallowed`: the owner's policy)."""

    type: Literal["view_ended"] = "view_ended"
    stream_id: Identifier
    code: ViewEndCode
    message: str = Field(default="", max_length=2000)


class ViewInput(_Frame):
    """Server to agent: a person's pointer or key input through the live view. Taken only while
    an operator has the device taken over, at most once per `input_id`, audited like any action.
    `x, y` are pixels of the frame it was aimed at (`frame_width` x `frame_height`)."""

    type: Literal["view_input"] = "view_input"
    input_id: Identifier
    kind: Literal["click", "double_click", "scroll", "key", "type"]
    x: int | None = Field(default=None, ge=0)
    y: int | None = Field(default=None, ge=0)
    frame_width: int | None = Field(default=None, ge=1)
    frame_height: int | None = Field(default=None, ge=1)
    button: Literal["left", "middle", "right"] = "left"
    direction: Literal["up", "down", "left", "right"] | None = None
    keys: str | None = Field(default=None, max_length=100)
    text: str | None = Field(default=None, max_length=2000)
    by: str = Field(default="", max_length=200)


class ViewInputResult(_Frame):
    """Agent to server: what became of one `view_input` (`ok`, or a stable code and why)."""

    type: Literal["view_input_result"] = "view_input_result"
    input_id: Identifier
    ok: bool
    code: str = Field(default="", max_length=64)
    message: str = Field(default="", max_length=2000)


class RecordingEnd(_Frame):
    """Server to agent: an attempt that was recorded has ended; `keep` says whether its recording
    becomes the attempt's artifact (uploaded, capped at the agent's size limit) or is deleted."""

    type: Literal["recording_end"] = "recording_end"
    task_id: Identifier
    node_id: Identifier
    attempt: int = Field(ge=1)
    keep: bool
    outcome: str = Field(default="", max_length=64)  # how the attempt ended, for the artifact's name


class OwnerTakeover(_Frame):
    """Agent to server: the device's owner took the device over at the device itself, or handed
    it back (`orrery agent takeover` / `handback`). The agent is the one writer of this state;
    the server pauses the device's work as for an operator's takeover. Sent when it changes, and
    its current value is in every hello."""

    type: Literal["owner_takeover"] = "owner_takeover"
    state: OwnerTakeoverState


# ---------------------------------------------------------------- the union

Message = Annotated[
    Hello
    | Welcome
    | Heartbeat
    | CommandBatch
    | BatchAccepted
    | ResultBatch
    | Cancel
    | ToolsChanged
    | ApprovalRequest
    | ApprovalDecision
    | Error
    | SafetyBreach
    | DeviceControl
    | View
    | ViewFrame
    | ViewEnded
    | ViewInput
    | ViewInputResult
    | RecordingEnd
    | OwnerTakeover,
    Field(discriminator="type"),
]

RELIABLE_TYPES = frozenset(
    {
        "command_batch",
        "cancel",
        "batch_accepted",
        "result_batch",
        "tools_changed",
        "approval_request",
        "approval_decision",
        "safety_breach",
        "device_control",
        "owner_takeover",
        "recording_end",
    }
)
SERVER_TO_AGENT = frozenset(
    {
        "welcome",
        "heartbeat",
        "command_batch",
        "cancel",
        "approval_decision",
        "device_control",
        "error",
        "view",
        "view_input",
        "recording_end",
    }
)
AGENT_TO_SERVER = frozenset(
    {
        "hello",
        "heartbeat",
        "batch_accepted",
        "result_batch",
        "tools_changed",
        "approval_request",
        "approval_decision",
        "safety_breach",
        "error",
        "view_frame",
        "view_ended",
        "view_input_result",
        "owner_takeover",
    }
)


def is_reliable(message: Message) -> bool:
    return message.type in RELIABLE_TYPES
