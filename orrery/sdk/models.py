"""Typed answers of the REST API (SPEC section 3). Each model keeps what a newer server adds
(`extra="allow"`: read it as an attribute or from `model_extra`), and requires only the fields
every server sends; tests/unit/sdk/test_models_match_openapi.py checks them against the OpenAPI
document the server serves, so a field renamed or removed there fails the suite."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

TASK_ENDS = frozenset({"succeeded", "failed", "cancelled"})  # the states a task ends in
NODE_ENDS = frozenset({"succeeded", "failed", "skipped", "cancelled"})


class Answer(BaseModel):
    """The base of every answer: unknown fields are kept, never refused."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)


# ---------------------------------------------------------------- tasks


class Attempt(Answer):
    """One try of a node on one device."""

    n: int
    device_id: str
    batch_id: str
    status: str
    started_at: datetime
    accepted_at: datetime | None = None
    ended_at: datetime | None = None
    commands: list[dict[str, Any]] = Field(default_factory=list)
    results: list[dict[str, Any]] = Field(default_factory=list)
    error: dict[str, Any] | None = None
    kind: str = "tool"


class Child(Answer):
    """A fan-out node's run on one device."""

    device_id: str
    device: str
    state: str
    queued_on: str | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    output: Any = None
    error: dict[str, Any] | None = None
    verification: dict[str, Any] | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class Node(Answer):
    """A node of a task, with its state, attempts and output."""

    id: str
    kind: str
    state: str
    placement: dict[str, Any] = Field(default_factory=dict)
    commands: list[dict[str, Any]] = Field(default_factory=list)
    instruction: str | None = None
    retry: dict[str, Any] = Field(default_factory=dict)
    priority: int = 0
    queue_timeout_s: float | None = None
    timeout_s: float | None = None
    queued_on: str | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    output: Any = None
    error: dict[str, Any] | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    for_each: dict[str, Any] | None = None
    verify: list[dict[str, Any]] = Field(default_factory=list)
    verification: dict[str, Any] | None = None
    fan_out: dict[str, Any] | None = None
    children: list[Child] | None = None

    @property
    def ended(self) -> bool:
        return self.state in NODE_ENDS


class Edge(Answer):
    """`source` -> `target` (`from`/`to` on the wire), taken `on` success, failure or always."""

    source: str = Field(alias="from")
    target: str = Field(alias="to")
    on: str = "success"


class TaskWarning(Answer):
    """Something a submission was accepted with that probably does not do what was meant."""

    code: str
    message: str
    node_id: str | None = None


class Task(Answer):
    """A task; `nodes` and `edges` are None in a listing (get the task for them)."""

    id: str
    name: str
    state: str
    created_at: datetime
    priority: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    request: str | None = None
    finished_at: datetime | None = None
    error: dict[str, Any] | None = None
    dag_version: int = 1
    rerun_of: str | None = None
    node_counts: dict[str, int] = Field(default_factory=dict)
    nodes: list[Node] | None = None
    edges: list[Edge] | None = None
    warnings: list[TaskWarning] = Field(default_factory=list)

    @property
    def ended(self) -> bool:
        """Whether the task is over: succeeded, failed or cancelled."""
        return self.state in TASK_ENDS

    def node(self, node_id: str) -> Node:
        """The node with this id (KeyError if the task has none, or was listed without nodes)."""
        for node in self.nodes or []:
            if node.id == node_id:
                return node
        raise KeyError(node_id)


class Cancelling(Answer):
    """The answer to a cancel: the task's nodes are being cancelled."""

    task_id: str
    state: str


class Problem(Answer):
    """One thing wrong with a DAG, with the keys its code adds (`tool`, `nearest`, `cycle`, ...)."""

    code: str
    message: str
    node_id: str | None = None
    command: int | None = None
    field: str | None = None


class PlannedNode(Answer):
    """Where a node of a checked submission could run now."""

    id: str
    devices: list[str] = Field(default_factory=list)
    would_run_on: str | None = None
    refusals: list[dict[str, Any]] = Field(default_factory=list)
    fans_out_to: list[str] | None = None
    left_out: list[dict[str, str]] | None = None


class Validation(Answer):
    """What a dry run of a submission found; no task was created."""

    valid: bool
    problems: list[Problem] = Field(default_factory=list)
    warnings: list[TaskWarning] = Field(default_factory=list)
    nodes: list[PlannedNode] = Field(default_factory=list)


# ---------------------------------------------------------------- devices


class ToolAnnotations(Answer):
    read_only: bool = False
    idempotent: bool = False
    destructive: bool = False


class Tool(Answer):
    """One tool of a device's catalogue (`namespace.tool`)."""

    name: str
    namespace: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)
    annotations: ToolAnnotations = Field(default_factory=ToolAnnotations)
    tool_type: str = "action"


class Device(Answer):
    """A device: its state, labels, platform, tools and current work."""

    id: str
    name: str
    state: str
    created_at: datetime
    admin_state: str = "active"
    stop_reason: str | None = None
    liveness: str = "enrolled"
    labels: dict[str, str] = Field(default_factory=dict)
    platform: str = "other"
    info: dict[str, Any] = Field(default_factory=dict)
    tools: list[Tool] = Field(default_factory=list)
    current_batch: str | None = None
    current_task_id: str | None = None
    current_node_id: str | None = None
    queue_length: int = 0
    last_seen: datetime | None = None
    connected: bool = False
    cordon_reason: str | None = None
    takeover: Takeover | None = None

    @property
    def taken_over(self) -> bool:
        """A person has the device: its agent nodes wait for the handback."""
        return self.takeover is not None


class Takeover(Answer):
    """Who has a device taken over: an operator (`source` "operator", handed back through the API)
    or its owner at the device ("owner")."""

    source: str
    by: str
    since: datetime | None = None
    reason: str = ""
    taken_over: bool = True


class Enrollment(Answer):
    """A new device: its id and its token, which is shown this once."""

    id: str
    name: str
    token: str


# ---------------------------------------------------------------- approvals and artifacts


class Approval(Answer):
    """A command waiting for (or given) a person's decision."""

    id: str
    task_id: str
    node_id: str
    device_id: str
    tool: str
    state: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""
    local_only: bool = False
    created_at: datetime | None = None
    expires_at: datetime | None = None
    decided_at: datetime | None = None
    decided_by: str | None = None
    decision_reason: str | None = None
    requested_state: str | None = None
    requested_by: str | None = None
    screenshot_url: str | None = None


class Artifact(Answer):
    """A file a task's command published (one version of its name)."""

    id: str
    task_id: str
    name: str
    version: int
    sha256: str
    size: int
    current: bool = True
    node_id: str | None = None
    device_id: str | None = None
    batch_id: str | None = None
    created_at: datetime | None = None
    content_url: str | None = None
    content_type: str = "application/octet-stream"


# ---------------------------------------------------------------- live views


class LiveView(Answer):
    """A live view of a device's screen, for the API key that opened it: read its frames with
    `Client.view_frames` before `expires_at`."""

    view_id: str
    device_id: str
    expires_at: datetime
    frames_url: str
    fps: float = 2.0
    max_side: int = 1280
    quality: int = 70
    marks: bool = False


class Frame(Answer):
    """One frame of a live view: an image (`image`, its bytes; `mime`) of `width` x `height`
    pixels (the space input `x, y` are in) of a `screen_width` x `screen_height` screen, and the
    element marks of the device's last GUI observation (boxes in the frame's pixels)."""

    n: int
    mime: str
    image_b64: str
    width: int
    height: int
    screen_width: int = 0
    screen_height: int = 0
    source: str = ""
    marks: list[dict[str, Any]] = Field(default_factory=list)
    at: datetime | None = None

    @property
    def image(self) -> bytes:
        return base64.b64decode(self.image_b64)


class ViewEnd(Answer):
    """The end of a live view: why (`watch_disallowed`, `device_offline`, `lease_expired`, ...)."""

    code: str
    message: str = ""


class InputSent(Answer):
    """An input the device applied (a refusal is a `Conflict` with the device's code)."""

    ok: bool
    input_id: str


# ---------------------------------------------------------------- pages and events

T = TypeVar("T", bound=BaseModel)


class Page(Answer, Generic[T]):
    """One page of a listing; `next_cursor` asks for the next (None: this was the last)."""

    items: list[T]
    next_cursor: str | None = None


class Event(Answer):
    """One event of a task's stream (`task.state`, `node.state`, `node.attempt`, `dag.edited`):
    its id (the resume point), its type and its data, whose usual keys are also attributes."""

    id: int
    type: str
    task_id: str | None = None
    node_id: str | None = None
    state: str | None = None
    at: datetime | None = None
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def ends_task(self) -> bool:
        """Whether this is the task's last event: its `task.state` to an end state."""
        return self.type == "task.state" and self.node_id is None and self.state in TASK_ENDS
