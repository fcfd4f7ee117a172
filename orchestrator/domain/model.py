"""Domain vocabulary: identifiers, closed state sets and the DAG specification (SPEC section 2)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from enum import StrEnum
from types import UnionType
from typing import Annotated, Any, Literal, NewType, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator

TaskId = NewType("TaskId", str)
NodeId = NewType("NodeId", str)
DeviceId = NewType("DeviceId", str)
BatchId = NewType("BatchId", str)

SLUG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


class TaskState(StrEnum):
    PLANNING = "planning"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_TASK


_TERMINAL_TASK = {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED}


class NodeState(StrEnum):
    PENDING = "pending"  # waiting on its edges
    READY = "ready"  # edges satisfied, waiting for a device to queue on
    QUEUED = "queued"  # in a device's queue
    RUNNING = "running"  # a batch is assigned to a device
    WAITING_APPROVAL = "waiting_approval"  # running, but its device waits for a person's approval
    TAKEN_OVER = "taken_over"  # an agent node, paused before its next action: a person has its device
    # Its commands ended (succeeded, or with an unknown outcome) and its `verify`
    # commands are deciding whether it succeeded; no success edge fires before they pass.
    VERIFYING = "verifying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_NODE_STATES


TERMINAL_NODE_STATES = frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.SKIPPED, NodeState.CANCELLED})


class DeviceState(StrEnum):
    ENROLLED = "enrolled"
    IDLE = "idle"
    BUSY = "busy"
    SUSPECT = "suspect"
    OFFLINE = "offline"
    DRAINING = "draining"
    DRAINED = "drained"  # draining, and nothing running or queued: safe to take down
    CORDONED = "cordoned"
    STOPPED = "stopped"  # emergency stop: takes no work, its agent refuses action tools
    REVOKED = "revoked"


class AdminState(StrEnum):
    """What an operator asked of a device; combined with liveness into `DeviceState`."""

    ACTIVE = "active"
    DRAINING = "draining"
    CORDONED = "cordoned"
    # An operator's emergency stop (`POST /v1/devices/{id}/stop`): like cordoned, and its running
    # batch was cancelled and its agent refuses action tools until `.../resume`.
    STOPPED = "stopped"
    REVOKED = "revoked"


class Liveness(StrEnum):
    ENROLLED = "enrolled"  # never connected
    ONLINE = "online"
    SUSPECT = "suspect"
    OFFLINE = "offline"


class EdgeCondition(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    ALWAYS = "always"


class NodeKind(StrEnum):
    TOOL = "tool"
    AGENT = "agent"


class Role(StrEnum):
    ADMIN = "admin"
    OPERATOR = "operator"
    VIEWER = "viewer"

    def allows(self, needed: Role) -> bool:
        order = [Role.VIEWER, Role.OPERATOR, Role.ADMIN]
        return order.index(self) >= order.index(needed)


Platform = Literal["linux", "windows", "macos", "android", "ios", "other"]


# ---------------------------------------------------------------- DAG specification


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Placement(_Spec):
    device: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    platform: Platform | None = None


class RetryPolicy(_Spec):
    max_attempts: int = Field(default=1, ge=1, le=100)
    backoff_s: float = Field(default=1.0, ge=0, le=3600)
    backoff_max_s: float = Field(default=60.0, ge=0, le=86400)


class CommandSpec(_Spec):
    tool: str = Field(min_length=3, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(default=60.0, gt=0, le=86400)
    # The submitter vouches that running this command twice does no harm, so a failure after it
    # started may be retried even if its tool is neither read-only nor idempotent (SPEC section 2).
    idempotent: bool = Field(default=False, strict=True)


DEVICE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# The pattern in words, as the CLI and the API say it when they refuse a name.
DEVICE_NAME_WORDS = "letters, digits, '_', '.' and '-', starting with a letter or digit"
MAX_FAN_OUT_DEVICES = 10_000  # children of one fan-out node


class ForEach(_Spec):
    """Fan-out: run the node once on every matching device, found when it becomes ready.

    Devices are chosen by `labels`/`platform` (every device matching them) or named in `devices`
    (names or ids, in the order given); never both. `canary` devices run first and the rest only
    if all of them succeed; at most `max_parallel` children run at once; `failure_budget` K
    tolerates fewer than K failed children and stops the rollout at the K-th."""

    labels: dict[str, str] = Field(default_factory=dict)
    platform: Platform | None = None
    devices: list[Annotated[str, Field(min_length=1, max_length=100, pattern=DEVICE_NAME_PATTERN)]] | None = Field(
        default=None, min_length=1, max_length=MAX_FAN_OUT_DEVICES
    )
    max_parallel: int | None = Field(default=None, ge=1, le=MAX_FAN_OUT_DEVICES)
    canary: int = Field(default=0, ge=0, le=MAX_FAN_OUT_DEVICES)
    failure_budget: int | None = Field(default=None, ge=1, le=MAX_FAN_OUT_DEVICES)

    @model_validator(mode="after")
    def _one_selector(self) -> ForEach:
        if self.devices is not None and (self.labels or self.platform):
            raise ValueError("for_each takes either 'devices' (a list of names) or 'labels'/'platform', not both")
        if self.devices is not None and len(set(self.devices)) != len(self.devices):
            raise ValueError("for_each.devices names a device twice; name each device once")
        return self


class NodeSpec(_Spec):
    id: Annotated[str, Field(pattern=SLUG_PATTERN)]
    kind: NodeKind = NodeKind.TOOL
    # Not a shared `Placement()`: pydantic deep-copies an unhashable default (it holds a dict) for
    # every node it validates, which cost more than making an empty one.
    placement: Placement = Field(default_factory=Placement)
    commands: list[CommandSpec] = Field(default_factory=list)
    instruction: str | None = None
    max_steps: int = Field(default=20, ge=1, le=200)
    retry: RetryPolicy = RetryPolicy()
    queue_timeout_s: float | None = Field(default=None, gt=0, le=7 * 86400)
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 86400)
    priority: int = Field(default=0, ge=-1000, le=1000)
    # Run once on every matching device (replaces `placement`), and read-only commands
    # that decide whether the node succeeded (after its commands, or when their outcome is unknown).
    for_each: ForEach | None = None
    verify: list[CommandSpec] = Field(default_factory=list, max_length=100)
    # Screen recordings of its attempts on a device that can record (a GUI or browser device):
    # "failures" keeps one only when the attempt fails, is uncertain or is cancelled (the default
    # for agent nodes and nodes using gui/browser tools), "always" keeps every one, "off" none.
    record: Literal["off", "failures", "always"] | None = None

    @model_validator(mode="after")
    def _kind_fields(self) -> NodeSpec:
        if self.kind is NodeKind.TOOL and not self.commands:
            raise ValueError("a 'tool' node needs at least one command")
        if self.kind is NodeKind.AGENT and not self.instruction:
            raise ValueError("an 'agent' node needs an 'instruction'")
        if self.kind is NodeKind.AGENT and self.commands:
            raise ValueError("an 'agent' node has an 'instruction' instead of 'commands'")
        if self.for_each is not None and self.placement != Placement():
            raise ValueError(
                "a node with 'for_each' is placed by it (labels, platform or devices); leave out 'placement'"
            )
        return self

    def tools(self) -> list[str]:
        """Every tool the node needs on its device: its commands' and its verify commands'."""
        return [c.tool for c in self.commands] + [c.tool for c in self.verify]


class EdgeSpec(_Spec):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    source: str = Field(alias="from")
    target: str = Field(alias="to")
    on: EdgeCondition = EdgeCondition.SUCCESS


class DagSpec(_Spec):
    nodes: list[NodeSpec] = Field(min_length=1)
    edges: list[EdgeSpec] = Field(default_factory=list)


# ---------------------------------------------------------------- validation messages


def unknown_field(root: Any, loc: Sequence[str | int]) -> str | None:
    """What to say of the key `loc[-1]` that the model at `loc[:-1]` (from `root`, a model type)
    does not have: `unknown field 'placment'; did you mean 'placement'?` (or the fields it takes).
    None when `loc` does not lead to a model."""
    if not loc or not isinstance(loc[-1], str):
        return None
    current: Any = root
    for part in loc[:-1]:
        current = _child(current, part)
        if current is None:
            return None
    model = next((t for t in _alternatives(current) if _is_model(t)), None)
    if model is None:
        return None
    names = [f.alias or name for name, f in model.model_fields.items()]
    key = loc[-1]
    nearest = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if nearest:
        return f"unknown field '{key}'; did you mean '{nearest[0]}'?"
    return f"unknown field '{key}' (allowed: {', '.join(names)})"


def _child(tp: Any, part: str | int) -> Any:
    for t in _alternatives(tp):
        origin, args = get_origin(t), get_args(t)
        if _is_model(t) and isinstance(part, str):
            for name, f in t.model_fields.items():
                if part in (name, f.alias):
                    return f.annotation
        elif origin in (list, tuple) and isinstance(part, int) and args:
            return args[0]
        elif origin is dict and isinstance(part, str) and len(args) == 2:
            return args[1]
    return None


def _alternatives(tp: Any) -> list[Any]:
    """`tp` without `Annotated` and with each member of a union (`X | None`) on its own."""
    if get_origin(tp) is Annotated:
        return _alternatives(get_args(tp)[0])
    if get_origin(tp) in (Union, UnionType):
        return [t for arg in get_args(tp) for t in _alternatives(arg)]
    return [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)
