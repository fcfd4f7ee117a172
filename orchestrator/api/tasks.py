"""`/v1/tasks`: submit, list, get, cancel, re-run, and the event stream (SPEC section 3). Every
`{task_id}` is an id, a unique id prefix or the task's name (see `orchestrator.api.lookup`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import JSONResponse, StreamingResponse

from orchestrator.api.deps import Comp, Operator, Viewer
from orchestrator.api.errors import COMMON, LISTING, ApiError, problems
from orchestrator.api.lookup import find_task
from orchestrator.api.render import task_detail, task_json, task_out
from orchestrator.api.schemas import DryRunOut, Page, TaskCreate, TaskOut, TaskRerun, WarningOut
from orchestrator.api.submission import Rerun, create_task
from orchestrator.api.submission import dry_run as check_only
from orchestrator.domain.dag import Graph
from orchestrator.domain.model import DagSpec, EdgeSpec, NodeSpec, NodeState, TaskState
from orchestrator.domain.rerun import kept_nodes
from orchestrator.engine.records import CancelTask
from orchestrator.store.jsontext import json_text
from orchestrator.store.repo import StoredEvent, TaskBundle, TaskRows

router = APIRouter(prefix="/v1/tasks", tags=["tasks"], responses={**COMMON, **problems(404, 409)})

SSE_KEEPALIVE_S = 15.0
SSE_POLL_S = 2.0  # a reader with no wake-up looks at the store this often
KEY_CHECK_S = 2.0  # an open stream looks up its API key this often (a revoked key closes it)
MAX_EVENT_ID = 2**63 - 1  # event ids are signed 64-bit integers in every store

_SUBMIT_422 = (
    "`validation_error` (the body; `problems` names each field), `invalid_arguments` (a command's "
    "arguments fit its tool on no candidate device, or hold a NUL; with `node_id`, `command`, `field`), "
    "`planner_unavailable` (a `request` or an agent node and no LLM configured), or another DAG problem "
    "(`unknown_tool`, `no_capable_device`, `dag_cycle`, `unknown_node`, ...); `problems` lists every one"
)
_EVENT_FORMAT = (
    "Server-Sent Events, in id order: the task's stored events after `after` (or `Last-Event-ID`), then "
    "new ones as they are committed. Each event is `id: <event id>`, `event: <type>`, `data: <one JSON "
    "object>` and a blank line; the types are `task.state` (data: task_id, state, at), `node.state` "
    "(task_id, node_id, state, ...), `node.attempt` (an attempt's start, acceptance and end) and "
    "`dag.edited` (a re-plan changed the DAG). A line starting with `:` is a keep-alive comment, sent "
    "when nothing happened for a while. The stream ends after the `task.state` event of a finished "
    "task (succeeded, failed, cancelled); if the task has ended and no event follows the cursor the answer is "
    "204. A stream whose API key is revoked ends with an `error` event (data: task_id, `code: key_revoked`, "
    "detail; no id). To resume, send the last id received as `Last-Event-ID` or `?after=`."
)
_EVENT_EXAMPLE = (
    'id: 1\nevent: task.state\ndata: {"task_id":"task_0a1b2c","state":"running","at":"2026-01-01T00:00:00Z"}\n\n'
)


@router.post(
    "",
    status_code=201,
    response_model=TaskOut,
    responses={
        200: {
            "model": TaskOut | DryRunOut,
            "description": "with dry_run=true: what the submission would do (no task is created); otherwise "
            "the task an earlier request with the same Idempotency-Key and body created",
        },
        **problems(
            s409="`conflict`: this Idempotency-Key was used before with a different body",
            s422=_SUBMIT_422,
        ),
    },
)
async def submit(
    body: TaskCreate,
    comp: Comp,
    _p: Operator,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    dry_run: Annotated[
        bool, Query(description="check the body (placement, arguments, warnings, policy refusals) and create nothing")
    ] = False,
) -> Any:
    if dry_run:
        checked = DryRunOut.model_validate(await check_only(comp.store, comp.cluster, comp.settings, body))
        return JSONResponse(checked.model_dump(mode="json"), 200)
    warnings: list[dict[str, str]] = []
    task_id, created = await create_task(comp.store, comp.cluster, comp.settings, body, idempotency_key, warnings)
    if created is None:
        response.status_code = 200  # the same Idempotency-Key and body: the task made before
    shown = [WarningOut.model_validate(w).model_dump() for w in warnings]
    body_json = task_json(await _view(comp, task_id) if created is None else created, shown)
    return Response(body_json, response.status_code or 201, media_type="application/json")


@router.get("", response_model=Page, responses=LISTING)
async def list_tasks(
    comp: Comp,
    _p: Viewer,
    state: TaskState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Page:
    rows, nxt = await comp.store.list_tasks(state.value if state else None, limit, cursor)
    counts = await comp.store.task_node_counts([t.id for t in rows])
    return Page(items=[task_out(t, counts.get(t.id)) for t in rows], next_cursor=nxt)


@router.get("/{task_id}", response_model=TaskOut)
async def get_task(task_id: str, comp: Comp, _p: Viewer) -> Response:
    return Response(task_json(await _view(comp, task_id)), media_type="application/json")


@router.get("/{task_id}/llm", response_model=Page)
async def llm_calls(task_id: str, comp: Comp, _p: Viewer) -> Page:
    """Every model call made for the task (planning, agent steps, re-planning), secrets removed."""
    task_id = (await find_task(comp.store, task_id)).id
    rows = await comp.store.llm_calls(task_id)
    edits = await comp.store.dag_edits(task_id)
    items: list[Any] = [
        {
            "kind": "call",
            "id": r.id,
            "node_id": r.node_id,
            "purpose": r.purpose,
            "model": r.model,
            "messages": r.messages,
            "reply": r.reply,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "latency_ms": r.latency_ms,
            "error": r.error,
            "at": r.at,
        }
        for r in rows
    ]
    items += [
        {"kind": "dag_edit", "dag_edit": e.version, "reason": e.reason, "edits": e.edits, "at": e.at} for e in edits
    ]
    return Page(items=items)


@router.post("/{task_id}/cancel", status_code=202)
async def cancel(task_id: str, comp: Comp, _p: Operator) -> dict[str, Any]:
    task = await find_task(comp.store, task_id)
    if TaskState(task.state).terminal:
        raise ApiError(409, "conflict", f"task '{task.id}' already ended as {task.state}")
    await comp.cluster.submit(CancelTask(task.id))
    return {"task_id": task.id, "state": "cancelling"}


@router.post(
    "/{task_id}/rerun",
    status_code=201,
    response_model=TaskOut,
    responses=problems(
        s409="`conflict`: the task has not ended yet",
        s422="`unknown_node` (`from_node` is not a node of the task) or one of the submission's problems",
    ),
)
async def rerun(task_id: str, comp: Comp, _p: Operator, body: TaskRerun | None = None) -> TaskOut:
    """Run a finished task again as a new task (`rerun_of` links them): its whole DAG as it is
    now, or with `from_node` only that node and everything downstream of it; the other nodes
    keep their outcome and output, so references to them resolve as before."""
    from_node = body.from_node if body is not None else None
    found = await find_task(comp.store, task_id)
    bundle = await comp.store.get_task(found.id)
    if bundle is None:
        raise ApiError(404, "not_found", f"no task '{task_id}'")
    old = bundle.task
    if not TaskState(old.state).terminal:
        raise ApiError(409, "conflict", f"task '{old.id}' is still {old.state}; re-run it once it has ended")
    if from_node is not None and from_node not in {n.id for n in bundle.nodes}:
        known = ", ".join(n.id for n in bundle.nodes) or "none"
        raise ApiError(422, "unknown_node", f"task '{old.id}' has no node '{from_node}' (its nodes: {known})")
    base: dict[str, Any] = {"name": old.name, "priority": old.priority, "labels": old.labels or {}}
    if not bundle.nodes:  # it never got a plan: plan its request again
        new = TaskCreate(request=old.request or "", replan=old.replan, **base)
        new_id, created = await create_task(
            comp.store, comp.cluster, comp.settings, new, None, rerun=Rerun(old.id, old.request)
        )
    else:
        specs = [NodeSpec.model_validate(n.spec) for n in bundle.nodes]
        edges = [EdgeSpec.model_validate({"from": e.source, "to": e.target, "on": e.on}) for e in bundle.edges]
        states = {n.id: NodeState(n.state) for n in bundle.nodes}
        keep = kept_nodes(Graph.build([n.id for n in specs], edges), states, from_node)
        kept = {
            n.id: {
                "state": n.state,
                "output": n.output,
                "results": n.results,
                "error": n.error,
                "started_at": n.started_at,
                "finished_at": n.finished_at,
            }
            for n in bundle.nodes
            if n.id in keep
        }
        new = TaskCreate(dag=DagSpec(nodes=specs, edges=edges), replan=old.replan, **base)
        new_id, created = await create_task(
            comp.store, comp.cluster, comp.settings, new, None, rerun=Rerun(old.id, old.request, kept)
        )
    if created is None:
        return await _detail(comp, new_id)
    return task_detail(created)


@router.get(
    "/{task_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": _EVENT_FORMAT,
            "content": {
                "text/event-stream": {
                    "schema": {"type": "string", "description": "a stream of Server-Sent Events (see above)"},
                    "example": _EVENT_EXAMPLE,
                }
            },
        },
        204: {"description": "the task has ended and no event follows the cursor: nothing more will come"},
        **problems(s400="`bad_request`: `after` or `Last-Event-ID` is not an event id this server can use"),
    },
)
async def events(
    task_id: str,
    comp: Comp,
    principal: Viewer,
    after: Annotated[
        int | None,
        Query(
            ge=0,
            description="send the events after this id (at most 2^63-1; a larger one is 400 bad_request)",
            json_schema_extra={"maximum": MAX_EVENT_ID},
        ),
    ] = None,
    last_event_id: Annotated[
        str | None, Header(description="as `after` (used when `after` is absent): an event id, digits only")
    ] = None,
) -> Response:
    resume = _cursor("Last-Event-ID", last_event_id)
    start = _cursor("after", str(after)) if after is not None else resume
    task = await find_task(comp.store, task_id)
    if TaskState(task.state).terminal and not await comp.store.events_after(task.id, start, 1):
        # Nothing can follow: 204 (rather than a stream of keep-alives for ever); an SSE client
        # stops reconnecting on a 204 (HTML Living Standard, server-sent events).
        return Response(status_code=204, headers={"Cache-Control": "no-cache"})
    return StreamingResponse(
        _stream(comp, task.id, start, principal.key_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(comp: Any, task_id: str, after: int, key_id: str | None = None) -> AsyncIterator[str]:
    """Stored events after `after`, then new ones as they are committed. The store is the only
    source: a wake-up from the bus (or a poll every `SSE_POLL_S` without one) makes the reader
    look for events after the last id it sent, so a lost wake-up delays an event and never
    skips it. We subscribe before the first read, so nothing committed meanwhile is missed.
    Events go out in id order, in chunks; Starlette ends the generator when the client leaves.

    The stream ends after the task's final `task.state`, or once the task has ended and nothing
    follows the reader's cursor (a cursor past the end). Every `KEY_CHECK_S` the reader's API
    key (`key_id`) is looked up in the store, so a key revoked on any replica closes its streams
    within seconds: a last `error` event (no `id`) with `code: key_revoked`, then the end."""
    last = after
    quiet = 0.0
    key_checked = time.monotonic()
    async with comp.bus.subscribe(task_id) as waker:
        while True:
            if key_id is not None and time.monotonic() - key_checked >= KEY_CHECK_S:
                if not await comp.store.api_key_active(key_id):
                    yield _closing(task_id, "key_revoked", "the API key of this stream was revoked; the stream ends")
                    return
                key_checked = time.monotonic()
            batch = await comp.store.events_after(task_id, last)
            if batch:
                quiet = 0.0
                last = batch[-1].id
                yield "".join(_frame(ev.id, ev.type, ev.text) for ev in batch)
                if any(_ends(ev) for ev in batch):
                    return
                if len(batch) >= 1000:
                    continue  # more are waiting
            elif _over(await comp.store.task_state(task_id)):
                # A task's final state and its event are committed together, so a read after
                # seeing the state finds every event there will be; none after the cursor: done.
                if not await comp.store.events_after(task_id, last, 1):
                    return
                continue
            if not await waker.wait(SSE_POLL_S):
                quiet += SSE_POLL_S
                if quiet >= SSE_KEEPALIVE_S:
                    quiet = 0.0
                    yield ": keep-alive\n\n"


def _frame(event_id: int, type_: str, data: str) -> str:
    return f"id: {event_id}\nevent: {type_}\ndata: {data}\n\n"


def _ends(event: StoredEvent) -> bool:
    return event.type == "task.state" and event.data.get("state") in ("succeeded", "failed", "cancelled")


def _closing(task_id: str, code: str, detail: str) -> str:
    """The last frame of a stream the server ends early: `event: error`, no `id` (a client's
    resume point stays the last real event)."""
    return f"event: error\ndata: {json_text({'task_id': task_id, 'code': code, 'detail': detail})}\n\n"


def _over(state: str | None) -> bool:
    return state is None or TaskState(state).terminal


def _cursor(name: str, value: str | None) -> int:
    """An event id a reader resumes after: digits only, at most `MAX_EVENT_ID` (the stores keep
    ids in a signed 64-bit integer, so a larger one could never match and breaks the query)."""
    if not value:
        return 0
    if not value.isascii() or not value.isdigit():
        raise ApiError(400, "bad_request", f"{name} must be an event id (digits only), not {value[:40]!r}")
    if len(value) > len(str(MAX_EVENT_ID)) or int(value) > MAX_EVENT_ID:
        raise ApiError(400, "bad_request", f"{name} is past the largest event id ({MAX_EVENT_ID})")
    return int(value)


async def _view(comp: Any, task_id: str) -> TaskBundle | TaskRows:
    bundle: TaskBundle | TaskRows | None = await comp.store.task_view((await find_task(comp.store, task_id)).id)
    if bundle is None:
        raise ApiError(404, "not_found", f"no task '{task_id}'")
    return bundle


async def _detail(comp: Any, task_id: str) -> TaskOut:
    return task_detail(await _view(comp, task_id))
