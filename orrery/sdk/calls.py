"""The REST API's requests as data, and its answers read into models: the part of the SDK that
does no I/O, shared by `Client` and `AsyncClient`, which only send a `Call` and hand the answer
back to `Call.answer`. The paths and bodies are the server's (orchestrator/api/*.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from orrery.sdk.dag import Dag
from orrery.sdk.errors import InvalidRequest, OrreryError, ServerError, from_problem
from orrery.sdk.models import (
    Approval,
    Artifact,
    Cancelling,
    Device,
    Enrollment,
    InputSent,
    LiveView,
    Page,
    Task,
    Validation,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
DagLike = Dag | Mapping[str, Any]
Decision = Literal["approve", "deny"]
MAX_PAGE = 500  # the largest `limit` a listing takes

NO_KEY = (
    "no API key: pass api_key=..., set ORRERY_API_KEY, "
    "or set ORRERY_DATA_DIR to the server's data directory (it holds admin.key)"
)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer (`read` gets the JSON, or the bytes if `raw`)."""

    method: str
    path: str
    read: Callable[[Any], T]
    params: dict[str, str | int] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bool = False

    def answer(self, status: int, content: bytes, has_key: bool = True) -> T:
        """What the answer means: the model read from it, or the `OrreryError` it says."""
        if status >= 400:
            raise problem(status, content, has_key)
        if self.raw:
            return self.read(content)
        try:
            data = json.loads(content) if content else None
        except ValueError:
            raise ServerError(
                status, "bad_response", f"{self.method} {self.path} was answered with something not JSON"
            ) from None
        try:
            return self.read(data)
        except ValidationError as exc:
            raise ServerError(
                status,
                "bad_response",
                f"{self.method} {self.path} was answered with an unexpected shape: {exc.errors()[0]['msg']}",
            ) from None


def problem(status: int, content: bytes, has_key: bool = True) -> OrreryError:
    """The error an answer with status >= 400 means (its problem+json body, if it has one)."""
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = {}
    error = from_problem(status, body, content.decode(errors="replace"))
    if status == 401 and not has_key:
        error.detail = NO_KEY
    return error


def _model(kind: type[M]) -> Callable[[Any], M]:
    return kind.model_validate


def _page(kind: type[M]) -> Callable[[Any], Page[M]]:
    return Page[kind].model_validate  # type: ignore[valid-type]


def _segment(value: str) -> str:
    """An id, id prefix or name as one path segment (a name may hold any character)."""
    return quote(value, safe="")


# ---------------------------------------------------------------- tasks


def submission(
    dag: DagLike | None = None,
    *,
    request: str | None = None,
    name: str | None = None,
    priority: int | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The body of `POST /v1/tasks`: a DAG (a `Dag`, a `{nodes, edges, name?}` dict as a DAG file
    holds, or a whole body `{dag | request, ...}`) or a plain-language `request` for the planner."""
    if isinstance(dag, Dag):
        body: dict[str, Any] = {"dag": dag.to_dict()}
        if dag.name is not None:
            body["name"] = dag.name
    elif dag is None:
        body = {}
    elif "nodes" in dag:
        spec = dict(dag)
        body = {"dag": spec}
        if "name" in spec:
            body["name"] = spec.pop("name")
    else:
        body = dict(dag)
    if request is not None:
        body["request"] = request
    if ("dag" in body) == ("request" in body):
        raise InvalidRequest(
            0, "validation_error", "give exactly one of a DAG or a `request` (plain text, for the planner)"
        )
    for key, value in (("name", name), ("priority", priority), ("labels", dict(labels) if labels else None)):
        if value is not None:
            body[key] = value
    return body


def submit(body: dict[str, Any], idempotency_key: str | None = None) -> Call[Task]:
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Call("POST", "/v1/tasks", _model(Task), json=body, headers=headers)


def validate(body: dict[str, Any]) -> Call[Validation]:
    return Call("POST", "/v1/tasks", _model(Validation), params={"dry_run": "true"}, json=body)


def task(task_id: str) -> Call[Task]:
    return Call("GET", f"/v1/tasks/{_segment(task_id)}", _model(Task))


def tasks_page(state: str | None = None, limit: int = 100, cursor: str | None = None) -> Call[Page[Task]]:
    params: dict[str, str | int] = {"limit": limit}
    if state:
        params["state"] = state
    if cursor:
        params["cursor"] = cursor
    return Call("GET", "/v1/tasks", _page(Task), params=params)


def cancel(task_id: str) -> Call[Cancelling]:
    return Call("POST", f"/v1/tasks/{_segment(task_id)}/cancel", _model(Cancelling))


def rerun(task_id: str, from_node: str | None = None) -> Call[Task]:
    body = {"from_node": from_node} if from_node else {}
    return Call("POST", f"/v1/tasks/{_segment(task_id)}/rerun", _model(Task), json=body)


def events_path(task_id: str) -> str:
    return f"/v1/tasks/{_segment(task_id)}/events"


# ---------------------------------------------------------------- devices


def devices() -> Call[list[Device]]:
    return Call("GET", "/v1/devices", lambda data: _page(Device)(data).items)


def device(device_id: str) -> Call[Device]:
    return Call("GET", f"/v1/devices/{_segment(device_id)}", _model(Device))


def takeover(device_id: str, reason: str = "") -> Call[Device]:
    return Call("POST", f"/v1/devices/{_segment(device_id)}/takeover", _model(Device), json={"reason": reason})


def handback(device_id: str, note: str = "") -> Call[Device]:
    return Call("POST", f"/v1/devices/{_segment(device_id)}/handback", _model(Device), json={"note": note})


def enroll(name: str, labels: Mapping[str, str] | None = None) -> Call[Enrollment]:
    return Call("POST", "/v1/devices", _model(Enrollment), json={"name": name, "labels": dict(labels or {})})


def open_view(
    device_id: str,
    fps: float | None = None,
    max_side: int | None = None,
    quality: int | None = None,
    marks: bool = False,
) -> Call[LiveView]:
    body: dict[str, Any] = {"marks": marks}
    for key, value in (("fps", fps), ("max_side", max_side), ("quality", quality)):
        if value is not None:
            body[key] = value
    return Call("POST", f"/v1/devices/{_segment(device_id)}/views", _model(LiveView), json=body)


InputKind = Literal["click", "double_click", "scroll", "key", "type"]


def send_input(device_id: str, kind: InputKind, **fields: Any) -> Call[InputSent]:
    """The body of `POST /v1/devices/{id}/input`: `kind` and the fields given (None: left out)."""
    body = {"kind": kind, **{k: v for k, v in fields.items() if v is not None}}
    return Call("POST", f"/v1/devices/{_segment(device_id)}/input", _model(InputSent), json=body)


# ---------------------------------------------------------------- approvals


def approvals_page(
    state: str | None = "pending",
    task_id: str | None = None,
    order: Literal["oldest", "newest"] = "oldest",
    limit: int = 100,
    cursor: str | None = None,
) -> Call[Page[Approval]]:
    params: dict[str, str | int] = {"limit": limit, "order": order}
    if state:
        params["state"] = state
    if task_id:
        params["task_id"] = task_id
    if cursor:
        params["cursor"] = cursor
    return Call("GET", "/v1/approvals", _page(Approval), params=params)


def approval(approval_id: str) -> Call[Approval]:
    return Call("GET", f"/v1/approvals/{_segment(approval_id)}", _model(Approval))


def approval_screenshot(approval_id: str) -> Call[bytes]:
    return Call("GET", f"/v1/approvals/{_segment(approval_id)}/screenshot", bytes, raw=True)


def decide(approval_id: str, decision: Decision, reason: str = "") -> Call[Approval]:
    if decision not in ("approve", "deny"):
        raise InvalidRequest(0, "validation_error", f"a decision is 'approve' or 'deny', not {decision!r}")
    path = f"/v1/approvals/{_segment(approval_id)}/{decision}"
    return Call("POST", path, _model(Approval), json={"reason": reason})


# ---------------------------------------------------------------- artifacts


def artifacts_page(
    task_id: str, history: bool = False, limit: int = 100, cursor: str | None = None
) -> Call[Page[Artifact]]:
    params: dict[str, str | int] = {"limit": limit, "history": str(history).lower()}
    if cursor:
        params["cursor"] = cursor
    return Call("GET", f"/v1/tasks/{_segment(task_id)}/artifacts", _page(Artifact), params=params)


def artifact(task_id: str, name: str, version: int | None = None) -> Call[Artifact]:
    params: dict[str, str | int] = {"version": version} if version is not None else {}
    path = f"/v1/tasks/{_segment(task_id)}/artifacts/{_segment(name)}"
    return Call("GET", path, _model(Artifact), params=params)


def artifact_content(task_id: str, name: str, version: int | None = None) -> Call[bytes]:
    params: dict[str, str | int] = {"version": version} if version is not None else {}
    path = f"/v1/tasks/{_segment(task_id)}/artifacts/{_segment(name)}/content"
    return Call("GET", path, bytes, params=params, raw=True)
