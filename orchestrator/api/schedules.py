"""`/v1/schedules`: cron schedules that submit a task at every tick.

Create (operator), list and get (viewer, with the next runs and the last run's task), the ticks and
what happened at each, pause, resume and delete (its tasks stay). A `{schedule_id}` is an id, a
unique id prefix or the schedule's name. Every change goes through the cluster to the engine leader,
the one writer of schedules, which fires their ticks in its step (see `engine/schedules.py`).

Cron arithmetic (checking an expression, the next runs, a tick's local time) runs off the event
loop (`engine/cron_worker.py`): a rare expression walks the calendar for each tick.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from orchestrator.api.deps import Comp, Operator, Viewer
from orchestrator.api.errors import COMMON, LISTING, ApiError, problems
from orchestrator.api.lookup import find_schedule
from orchestrator.api.schedule_schemas import ScheduleCreate, ScheduleOut, TickOut, cron_of, schedule_out, tick_out
from orchestrator.api.schemas import Page, TaskCreate
from orchestrator.api.submission import nul_problems
from orchestrator.config import Settings
from orchestrator.domain import cron as crons
from orchestrator.domain import dag
from orchestrator.domain.model import NodeKind
from orchestrator.domain.problems import DomainError, Problem
from orchestrator.domain.schedule import TickOutcome
from orchestrator.engine.cron_worker import off_loop
from orchestrator.engine.records import DeviceRun
from orchestrator.engine.schedule_records import ChangeSchedule, Reply, ScheduleAction
from orchestrator.engine.validation import problem_out, validate_against, warnings_against
from orchestrator.ids import new_id
from orchestrator.store import schedules as stored
from orchestrator.store.models import Schedule, ScheduleTick

router = APIRouter(prefix="/v1/schedules", tags=["schedules"], responses={**COMMON, **problems(404, 409)})

_CREATE_422 = (
    "`invalid_cron` (`field: cron`), "
    "`cron_too_rare` (`field: cron`: it must fire at least every 8 years, as a leap day does), "
    "`unknown_timezone` (`field: timezone`, an IANA name: not `localtime` or `Factory`; with the `nearest` names), "
    "`validation_error`, `planner_unavailable`, or a DAG problem of the task as `POST /v1/tasks` reports it "
    "(`dag_cycle`, `unknown_node`, ...); `problems` lists every one. What depends on the devices enrolled now "
    "(`unknown_tool`, `no_capable_device`, `invalid_arguments`, `retry_not_safe`) comes back as `warnings`"
)
_FLEET_NOTE = "; checked against the devices enrolled now: each tick's task is placed when it runs"


@router.post(
    "",
    status_code=201,
    response_model=ScheduleOut,
    responses=problems(s409="`conflict`: a schedule of that name exists (`schedule_id` names it)", s422=_CREATE_422),
)
async def create(body: ScheduleCreate, comp: Comp, _p: Operator) -> ScheduleOut:
    """A schedule: its first tick is the first one after now (none while `paused`)."""
    now = time.time()
    found = await off_loop(_cron_problems, body.cron, body.timezone, now)
    refused, warnings = check_task(body.task, comp.settings, await comp.cluster.devices())
    if found or refused:
        raise DomainError(found + refused)
    taken = await stored.by_name(comp.store, body.name)
    if taken is not None:
        raise _taken(body.name, taken.id)
    schedule_id = new_id("sch")
    definition = {
        **body.model_dump(mode="json", by_alias=True),
        "task": body.task.model_dump(mode="json", by_alias=True, exclude_defaults=True),  # as it was given
        "created": now,
    }
    _answered(await comp.cluster.submit(ChangeSchedule(ScheduleAction.CREATE, schedule_id, definition)), body.name)
    return await _render(comp, await _reload(comp, schedule_id), warnings=warnings)


def _cron_problems(expression: str, timezone: str, now: float) -> list[Problem]:
    """What is wrong with a new schedule's cron and zone: unreadable, never firing, or too rare."""
    try:
        crons.regular(crons.parse(expression, timezone, now), now)
    except crons.CronError as exc:
        return exc.problems
    return []


def check_task(body: TaskCreate, settings: Settings, devices: list[DeviceRun]) -> tuple[list[Problem], list[Any]]:
    """A schedule's task checked as `POST /v1/tasks` checks a submission, with the same codes, except
    that its devices need not exist yet: what the fleet decides today is a warning, not a refusal."""
    llm = settings.llm_configured
    if body.request is not None and not llm:
        return [_no_llm("this server has no LLM configured (ORRERY_LLM_BASE_URL, ORRERY_LLM_MODEL); give a 'dag'")], []
    spec = body.dag
    if spec is None:
        return [], []
    if refused := nul_problems(spec):
        return refused, []
    if not llm and any(n.kind is NodeKind.AGENT for n in spec.nodes):
        return [_no_llm("agent nodes need an LLM and this server has none configured; use tool nodes")], []
    every_tool = {tool for n in spec.nodes for tool in n.tools()}  # its commands' and its verify commands'
    structural = dag.validate(spec, every_tool, settings.dag_limits)
    if structural:
        return structural, []
    fleet = [_warning(p) for p in validate_against(spec, devices, settings.dag_limits)]
    return [], fleet + [w.as_dict() for w in warnings_against(spec, devices)]


@router.get("", response_model=Page, responses=LISTING)
async def list_schedules(
    comp: Comp,
    _p: Viewer,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Page:
    """Schedules by name, each with its next runs and its last run's task."""
    rows, nxt = await stored.page(comp.store, limit, cursor)
    return Page(items=await _render_all(comp, rows), next_cursor=nxt)


@router.get("/{schedule_id}", response_model=ScheduleOut)
async def get_schedule(
    schedule_id: str,
    comp: Comp,
    _p: Viewer,
    next_runs: Annotated[
        int, Query(alias="next", ge=1, le=crons.MAX_NEXT, description="how many next runs to show")
    ] = 5,
) -> ScheduleOut:
    return await _render(comp, await find_schedule(comp.store, schedule_id), next_runs)


@router.get("/{schedule_id}/ticks", response_model=Page, responses=LISTING)
async def list_ticks(
    schedule_id: str,
    comp: Comp,
    _p: Viewer,
    outcome: Annotated[TickOutcome | None, Query(description="only ticks with this outcome")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Page:
    """What happened at each tick, newest first: `created` (with its task), `queued`, `skipped`,
    `missed` (no engine ran at its time) or `failed`, with a `detail` saying why."""
    row = await find_schedule(comp.store, schedule_id)
    ticks, nxt = await stored.ticks(comp.store, row.id, limit, cursor, outcome.value if outcome else None)
    tasks = await stored.tasks(comp.store, sorted({t.task_id for t in ticks if t.task_id}))
    items = await off_loop(_ticks_out, row, ticks, tasks, time.time())
    return Page(items=items, next_cursor=nxt)


@router.post("/{schedule_id}/pause", response_model=ScheduleOut)
async def pause(schedule_id: str, comp: Comp, _p: Operator) -> ScheduleOut:
    """No more ticks until resumed; ticks waiting in its queue are skipped. Pausing a paused one changes nothing."""
    return await _change(comp, schedule_id, ScheduleAction.PAUSE)


@router.post("/{schedule_id}/resume", response_model=ScheduleOut)
async def resume(schedule_id: str, comp: Comp, _p: Operator) -> ScheduleOut:
    """Ticks again from the next future one: the paused time is not caught up."""
    return await _change(comp, schedule_id, ScheduleAction.RESUME)


@router.delete("/{schedule_id}")
async def delete(schedule_id: str, comp: Comp, _p: Operator) -> dict[str, Any]:
    """The schedule and its tick history go; the tasks it made stay (a running one runs on)."""
    row = await find_schedule(comp.store, schedule_id)
    _answered(await comp.cluster.submit(ChangeSchedule(ScheduleAction.DELETE, row.id)), row.name)
    return {"id": row.id, "name": row.name, "deleted": True}


# ---------------------------------------------------------------- helpers


async def _change(comp: Comp, ref: str, action: ScheduleAction) -> ScheduleOut:
    row = await find_schedule(comp.store, ref)
    _answered(await comp.cluster.submit(ChangeSchedule(action, row.id)), row.name)
    return await _render(comp, await _reload(comp, row.id))


def _answered(reply: Reply | None, name: str) -> None:
    """The engine's answer to a change, as the HTTP problem it stands for when it refused."""
    if isinstance(reply, dict) and reply.get("ok"):
        return
    reply = reply if isinstance(reply, dict) else {}
    code = str(reply.get("code") or "unavailable")
    detail = str(reply.get("detail") or "the engine did not take the change; retry")
    if code == "conflict":
        raise _taken(name, str(reply.get("schedule_id") or ""))
    raise ApiError({"not_found": 404, "validation_error": 422}.get(code, 503), code, detail)


def _taken(name: str, holder: str) -> ApiError:
    return ApiError(
        409,
        "conflict",
        f"a schedule named '{name}' exists ({holder}); delete it first or choose another name",
        schedule_id=holder,
    )


async def _reload(comp: Comp, schedule_id: str) -> Schedule:
    row = await stored.get(comp.store, schedule_id)
    if row is None:  # deleted meanwhile by another request
        raise ApiError(404, "not_found", f"no schedule '{schedule_id}' (it was deleted)")
    return row


async def _render(
    comp: Comp, row: Schedule, next_count: int = 5, warnings: list[dict[str, Any]] | None = None
) -> ScheduleOut:
    tasks = await stored.tasks(comp.store, [row.last_task_id] if row.last_task_id else [])
    queued = (await stored.queued(comp.store, [row.id])).get(row.id, [])
    return await off_loop(schedule_out, row, time.time(), tasks, queued, next_count, warnings)


async def _render_all(comp: Comp, rows: list[Schedule]) -> list[ScheduleOut]:
    tasks = await stored.tasks(comp.store, [r.last_task_id for r in rows if r.last_task_id])
    queued = await stored.queued(comp.store, [r.id for r in rows])
    return await off_loop(_schedules_out, rows, tasks, queued, time.time())


def _schedules_out(
    rows: list[Schedule], tasks: dict[str, tuple[str, str]], queued: dict[str, list[datetime]], now: float
) -> list[ScheduleOut]:
    return [schedule_out(r, now, tasks, queued.get(r.id, [])) for r in rows]


def _ticks_out(
    row: Schedule, ticks: list[ScheduleTick], tasks: dict[str, tuple[str, str]], now: float
) -> list[TickOut]:
    cron = cron_of(row, now)
    return [tick_out(t, cron, tasks) for t in ticks]


def _warning(problem: Problem) -> dict[str, Any]:
    out = problem_out(problem)
    return {"code": out["code"], "node_id": out.get("node_id"), "message": out["message"] + _FLEET_NOTE}


def _no_llm(message: str) -> Problem:
    return Problem("planner_unavailable", message)
