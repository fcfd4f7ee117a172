"""Request and response bodies of the REST API (separate from wire models and tables)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from orchestrator.domain.model import DagSpec, Role
from protocol.messages import MAX_STOP_REASON_CHARS

# No text the API accepts contains U+0000: Postgres cannot store it in a text column (the driver
# fails, the request would end in a 500) and the device refuses it in arguments. Refused at the
# edge with the field named, the same on SQLite and Postgres; the schema says so too.
NO_NUL_PATTERN = "^[^\\u0000]*$"  # JSON Schema (ECMA-262) spelling: no U+0000 anywhere
NUL_MESSAGE = "must not contain a NUL character (U+0000)"


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(NUL_MESSAGE)
    return value


class _NoNul:
    """`Annotated[str, Field(<limits>), NO_NUL]`: refuses U+0000 (after the limits, so their
    messages stay) and adds `pattern: NO_NUL_PATTERN` to the JSON schema."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_no_nul, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out.setdefault("pattern", NO_NUL_PATTERN)
        return out


NO_NUL = _NoNul()
Text = Annotated[str, NO_NUL]  # a string without NUL, no other limit
TextKey = Annotated[str, AfterValidator(_no_nul)]  # the same for a dict's keys (schema: any key)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _task_create_schema(schema: dict[str, Any]) -> None:
    # Exactly one of the two, said in the schema too, so clients and fuzzers know the rule; the
    # one given is never null (the Python default None stands for "left out").
    schema["oneOf"] = [{"required": ["request"]}, {"required": ["dag"]}]
    dag = schema["properties"]["dag"]
    if "anyOf" in dag:
        dag.update(next(s for s in dag.pop("anyOf") if s.get("type") != "null"))
    for key in ("request", "dag"):
        schema["properties"][key].pop("default", None)  # left out, not null


class TaskCreate(_In):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_task_create_schema)

    name: Annotated[str, Field(max_length=200), NO_NUL] | None = None
    request: Annotated[
        Annotated[str, Field(min_length=1, max_length=20_000), NO_NUL] | None,
        WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 20_000, "pattern": NO_NUL_PATTERN}),
    ] = None
    dag: DagSpec | None = None
    priority: int = Field(default=0, ge=-1000, le=1000)
    labels: dict[TextKey, Text] = Field(default_factory=dict)
    replan: bool = False

    @model_validator(mode="before")
    @classmethod
    def _no_null_choice(cls, data: Any) -> Any:
        # The schema's oneOf is about which key is present, so a key given as null counts as
        # given: {"request": "...", "dag": null} names both, and is refused as the schema says.
        if isinstance(data, dict):
            for key in ("request", "dag"):
                if key in data and data[key] is None:
                    raise ValueError(f"'{key}' is null: leave it out, and give exactly one of 'request' or 'dag'")
        return data

    @model_validator(mode="after")
    def _one_of(self) -> TaskCreate:
        if (self.request is None) == (self.dag is None):
            raise ValueError("give exactly one of 'request' (plain text, needs an LLM) or 'dag' ({nodes, edges})")
        return self


# Device labels (enrollment and PATCH): keys a placement can name, values of bounded size.
LABEL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_./-]*$"
LabelKey = Annotated[str, Field(min_length=1, max_length=100, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, Field(max_length=200), NO_NUL]
MAX_LABELS = 64


class DeviceEnroll(_In):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)


class DeviceStopIn(_In):
    """Why the device is being stopped (optional): recorded in its history and sent to its agent."""

    reason: Annotated[
        str,
        Field(
            max_length=MAX_STOP_REASON_CHARS,
            strict=True,
            description=f"why the device is stopped, at most {MAX_STOP_REASON_CHARS} characters",
        ),
        NO_NUL,
    ] = ""


class DevicePatch(_In):
    """Labels to merge into the device's enrollment labels; a null value deletes that label."""

    labels: dict[LabelKey, LabelValue | None] = Field(default_factory=dict, max_length=MAX_LABELS)


class TaskRerun(_In):
    from_node: Annotated[str, Field(min_length=1, max_length=64), NO_NUL] | None = Field(
        default=None,
        description="run this node and everything downstream of it again; the other nodes keep their outcome",
    )


class DeviceEnrolled(BaseModel):
    id: str
    name: str
    token: str


class ApiKeyCreate(_In):
    role: Role
    name: Annotated[str, Field(max_length=200), NO_NUL] = ""


class ApiKeyCreated(BaseModel):
    id: str
    role: Role
    key: str
    name: str = ""


class AttemptOut(BaseModel):
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
    kind: str = Field(
        default="tool", description="tool, agent, step (one batch of an agent node) or verify (its verify commands)"
    )


class ChildOut(BaseModel):
    """A fan-out node's child on one device (the node pinned there)."""

    device_id: str
    device: str  # its name when the node became ready: the key of the node's output map
    state: str
    queued_on: str | None = None
    attempts: list[AttemptOut] = Field(default_factory=list)
    output: Any = None
    error: dict[str, Any] | None = None
    verification: dict[str, Any] | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class NodeOut(BaseModel):
    id: str
    kind: str
    state: str
    placement: dict[str, Any]
    commands: list[dict[str, Any]] = Field(default_factory=list)
    instruction: str | None = None
    retry: dict[str, Any]
    priority: int = 0
    queue_timeout_s: float | None = None
    timeout_s: float | None = None
    queued_on: str | None = None
    attempts: list[AttemptOut] = Field(default_factory=list)
    output: Any = None
    error: dict[str, Any] | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # Fan-out (its children, in rollout order; its attempts are theirs) and verify.
    for_each: dict[str, Any] | None = None
    verify: list[dict[str, Any]] = Field(default_factory=list)
    verification: dict[str, Any] | None = Field(
        default=None,
        description="how its verify commands are deciding (checking, probing) or decided (passed, failed, "
        "timed_out, revoked, cancelled) its outcome",
    )
    fan_out: dict[str, Any] | None = Field(
        default=None, description="a fan-out node's rollout: devices (how many children) and left_out"
    )
    children: list[ChildOut] | None = None


class EdgeOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    source: str = Field(alias="from")
    target: str = Field(alias="to")
    on: str


class WarningOut(BaseModel):
    """Something a submission was accepted with that probably does not do what was meant."""

    code: str
    node_id: str | None = None
    message: str


class TaskOut(BaseModel):
    id: str
    name: str
    state: str
    priority: int
    labels: dict[str, str]
    request: str | None = None
    created_at: datetime
    finished_at: datetime | None = None
    error: dict[str, Any] | None = None
    dag_version: int = 1
    rerun_of: str | None = None  # the task this one runs again
    node_counts: dict[str, int] = Field(default_factory=dict)
    nodes: list[NodeOut] | None = None
    edges: list[EdgeOut] | None = None
    warnings: list[WarningOut] = Field(default_factory=list)  # set on the answer to a submission


class ProblemOut(BaseModel):
    """One thing wrong with a DAG, with the keys its code adds (`tool`, `nearest`, `reference`, ...)."""

    model_config = ConfigDict(extra="allow")

    code: str
    message: str
    node_id: str | None = None
    command: int | None = None
    field: str | None = None


class RefusalOut(BaseModel):
    command: int
    tool: str
    device: str
    code: str
    message: str


class DryRunNode(BaseModel):
    id: str
    devices: list[str]  # names of the devices that may run it (placement and tools)
    would_run_on: str | None = None  # the device whose queue it would join now
    refusals: list[RefusalOut] = Field(default_factory=list)
    # A fan-out node: the devices it would run on now, in rollout order, and those it
    # would leave out (with why); null for other nodes.
    fans_out_to: list[str] | None = None
    left_out: list[dict[str, str]] | None = None


class DryRunOut(BaseModel):
    """What `POST /v1/tasks?dry_run=true` found; no task was created."""

    valid: bool
    problems: list[ProblemOut] = Field(default_factory=list)
    warnings: list[WarningOut] = Field(default_factory=list)
    nodes: list[DryRunNode] = Field(default_factory=list)


class DeviceOut(BaseModel):
    id: str
    name: str
    state: str
    admin_state: str = "active"  # what operators asked: active, draining, cordoned, stopped, revoked
    # Why an operator stopped it (emergency stop); null unless `admin_state` is `stopped`.
    stop_reason: str | None = None
    liveness: str = "enrolled"  # what heartbeats say: enrolled, online, suspect, offline
    labels: dict[str, str]
    platform: str
    info: dict[str, Any]
    tools: list[dict[str, Any]]
    current_batch: str | None = None
    current_task_id: str | None = None  # what its current batch belongs to (null when idle)
    current_node_id: str | None = None
    queue_length: int = 0
    last_seen: datetime | None = None
    connected: bool = False
    created_at: datetime
    cordon_reason: str | None = Field(
        default=None,
        description='why it is cordoned: "cordoned by an operator", or the safety budget its agent breached '
        "(null unless cordoned)",
    )
    control_generation: int = Field(
        default=0,
        description="the generation of the device's controls (stop, resume, budget reset) as operators want them",
    )
    control_applied: int = Field(
        default=0,
        description="the generation its agent last reported applied: below `control_generation`, the agent has "
        "not applied the latest stop, resume or budget reset yet (it is sent until it does)",
    )
    takeover: TakeoverOut | None = Field(
        default=None, description="who has the device taken over (null: nobody; tasks drive it)"
    )


class TakeoverOut(BaseModel):
    """A person has the device: its agent nodes pause before their next action, it takes no new
    work, and its agent refuses the model's input tools until the handback."""

    taken_over: bool = True
    source: Literal["operator", "owner"] = Field(
        description="`operator`: through the API (handed back there); `owner`: at the device itself "
        "(`orrery agent handback` there)"
    )
    by: str
    since: datetime | None = None
    reason: str = ""


class DeviceTakeoverIn(_In):
    """Why the device is taken over (optional): shown with it and in its history."""

    reason: Annotated[str, Field(max_length=MAX_STOP_REASON_CHARS, strict=True)] = ""


class DeviceHandbackIn(_In):
    """The note handed to the model with the device: what the person did, what it should know."""

    note: Annotated[str, Field(max_length=2000, strict=True)] = ""


class DeviceHistoryItem(BaseModel):
    state: str
    reason: str
    at: datetime


class DeviceAttemptItem(BaseModel):
    task_id: str
    task_name: str
    node_id: str
    n: int
    batch_id: str
    kind: str = "tool"
    status: str
    started_at: datetime
    ended_at: datetime | None = None
    error: dict[str, Any] | None = None


class Page(BaseModel):
    items: list[Any]
    next_cursor: str | None = None
