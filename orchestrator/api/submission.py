"""Accepting a task: idempotency, validation against the fleet, then the engine stores it."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from orchestrator.api.errors import ApiError
from orchestrator.api.render import NewTask
from orchestrator.api.schemas import TaskCreate
from orchestrator.cluster import Cluster
from orchestrator.config import Settings
from orchestrator.domain import placement
from orchestrator.domain.model import AdminState, DagSpec, Liveness, NodeKind, NodeSpec
from orchestrator.domain.problems import DomainError, Problem
from orchestrator.engine import validation
from orchestrator.engine.intake import Admission, KeptNode, Submission
from orchestrator.engine.records import DeviceRun, SubmitTask
from orchestrator.engine.validation import validate_against, warnings_against
from orchestrator.ids import new_id
from orchestrator.store.repo import Store


@dataclass(frozen=True)
class Rerun:
    """A task submitted as a re-run of another: the old task's id and request, and the nodes it
    keeps as they ended (node id -> state, output, results, error, started_at, finished_at)."""

    of: str
    request: str | None = None
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)


def body_hash(body: TaskCreate) -> str:
    data = body.model_dump(mode="json", by_alias=True)
    for node in (data.get("dag") or {}).get("nodes", []):
        for command in [*node.get("commands", []), *node.get("verify", [])]:
            if command.get("idempotent") is False:  # added later: a body hashed before still matches
                del command["idempotent"]
        if node.get("for_each") is None:  # likewise
            node.pop("for_each", None)
        if not node.get("verify"):
            node.pop("verify", None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


async def create_task(
    store: Store,
    cluster: Cluster,
    settings: Settings,
    body: TaskCreate,
    idempotency_key: str | None,
    warnings: list[dict[str, str]] | None = None,
    rerun: Rerun | None = None,
) -> tuple[str, NewTask | None]:
    """Check a new task and hand it to the engine, which stores and starts it (the engine is the
    one writer of tasks; the cluster finds it on whichever replica leads). A `rerun` links it to
    the task it runs again and starts its kept nodes as they ended there.

    Returns its id and, when it was created now, its rows (so the caller can answer from them
    without reading the task back). A `warnings` list given is filled with what the answer
    should warn about (also for the task an earlier request with the same key created)."""
    if body.dag is not None and (refused := nul_problems(body.dag)):
        raise DomainError(refused)  # before anything is looked up or handed over
    # Only a key's reuse compares bodies; without a key there is nothing to compare with, so the
    # hash (a third of a large POST's time) is not made and the row keeps none.
    digest = body_hash(body) if idempotency_key else ""
    if idempotency_key:  # the common retry is answered here, without the engine
        existing = await store.find_task_by_idempotency_key(idempotency_key)
        if existing is not None:
            found = _same_or_conflict(existing.id, existing.body_hash, digest)
            await _warn(store, cluster, settings, body, warnings)
            return found
    llm = settings.llm_configured
    spec = body.dag
    if spec is None and not llm:
        raise ApiError(
            422,
            "planner_unavailable",
            "this server has no LLM configured (ORRERY_LLM_BASE_URL, ORRERY_LLM_MODEL); submit an explicit 'dag'",
        )
    if spec is not None:
        if not llm and any(n.kind is NodeKind.AGENT for n in spec.nodes):
            raise ApiError(
                422,
                "planner_unavailable",
                "agent nodes need an LLM and this server has none configured; use tool nodes",
            )
        devices = await cluster.devices()
        # What each device asks approval for (a verify command must not wait on a person): read
        # only when some node has verify commands.
        policies = await device_policies(store) if any(n.verify for n in spec.nodes) else None
        problems = validate_against(spec, devices, settings.dag_limits, policies)
        if problems:
            raise DomainError(never_connected_hints(problems, spec, devices))
        if warnings is not None:
            warnings += [w.as_dict() for w in warnings_against(spec, devices)]
            warnings += await waiting_warnings(store, spec, devices, settings.queue_timeout_s)
    task_id = new_id("task")
    sub = Submission(
        task_id=task_id,
        name=body.name or f"task-{task_id[-6:]}",
        body_hash=digest or None,
        created=time.time(),
        spec=spec,
        request=rerun.request if rerun is not None else body.request,
        priority=body.priority,
        labels=dict(body.labels),
        replan=body.replan or body.request is not None,
        idempotency_key=idempotency_key,
        rerun_of=rerun.of if rerun is not None else None,
        kept={node_id: KeptNode(**kept) for node_id, kept in rerun.kept.items()} if rerun is not None else {},
    )
    admitted: Admission = await cluster.submit(SubmitTask(sub))
    if admitted["task_id"] != task_id:  # the key was used meanwhile (a concurrent retry)
        return _same_or_conflict(admitted["task_id"], admitted["body_hash"], digest)
    nodes, edges = sub.graph_rows()
    return task_id, NewTask(sub.task_row(), nodes, edges)


async def _warn(
    store: Store, cluster: Cluster, settings: Settings, body: TaskCreate, warnings: list[dict[str, str]] | None
) -> None:
    if warnings is not None and body.dag is not None:
        devices = await cluster.devices()
        warnings += [w.as_dict() for w in warnings_against(body.dag, devices)]
        warnings += await waiting_warnings(store, body.dag, devices, settings.queue_timeout_s)


def never_connected_hints(problems: list[Problem], spec: DagSpec, devices: list[DeviceRun]) -> list[Problem]:
    """`unknown_tool` for a node that a device whose agent never connected may run: the tool may
    well be there, the server just cannot know yet; say so, and how to start the agent."""
    if not any(p.code == "unknown_tool" for p in problems):
        return problems
    nodes = {n.id: n for n in spec.nodes}
    views = [d.view() for d in devices]
    return [_hinted(p, nodes, views) for p in problems]


def _hinted(problem: Problem, nodes: dict[str, NodeSpec], views: list[placement.DeviceView]) -> Problem:
    node = nodes.get(str(problem.extra.get("node", problem.extra.get("node_id", ""))))
    silent = placement.never_connected_matching(node, views) if problem.code == "unknown_tool" and node else []
    if not silent:
        return problem
    return Problem(problem.code, f"{problem.message}. {placement.start_agent_advice(silent)}", dict(problem.extra))


MAX_WAITING_SHOWN = 5


async def waiting_warnings(
    store: Store, spec: DagSpec, devices: list[DeviceRun], queue_timeout_s: float
) -> list[dict[str, str]]:
    """`no_device_available`: a node some devices can run, none of which takes work now (offline,
    suspect, stopped, cordoned, draining). It is accepted and waits in the queue, up to its
    `queue_timeout_s`, for one to come back; the warning names each device's state so the
    submitter knows what to fix. The store is read (for when an offline device was last seen)
    only when some node needs it."""
    out: list[tuple[NodeSpec, list[DeviceRun]]] = []
    by_signature: dict[Hashable, list[DeviceRun] | None] = {}
    for node in spec.nodes:
        if node.for_each is not None:
            continue  # a fan-out lists the devices it leaves out (`left_out`)
        key = placement.signature(node)
        if key not in by_signature:
            able = sorted(
                (d for d in devices if d.admin is not AdminState.REVOKED and placement.capable(node, d.view())),
                key=lambda d: d.name or d.id,
            )
            by_signature[key] = able if able and not any(d.view().takes_work for d in able) else None
        held = by_signature[key]
        if held:
            out.append((node, held))
    if not out:
        return []
    seen = {row.id: row.last_seen for row in await store.list_devices()}
    warnings = []
    for node, held in out:
        states = "; ".join(
            f"{d.name or d.id} is {device_condition(d, seen.get(d.id))}" for d in held[:MAX_WAITING_SHOWN]
        )
        more = len(held) - MAX_WAITING_SHOWN
        limit = node.queue_timeout_s or queue_timeout_s
        warnings.append(
            {
                "code": "no_device_available",
                "node_id": node.id,
                "message": f"node '{node.id}' may run only on devices that take no work now: {states}"
                + (f"; and {more} more" if more > 0 else "")
                + f". It will wait up to queue_timeout_s={limit:g} for one to come back, then fail with "
                "queue_timeout; start the device's agent, or uncordon or resume it",
            }
        )
    return warnings


def _said(state: str, reason: str | None) -> str:
    """The state with its recorded reason (which often already starts with the state's words)."""
    if not reason:
        return state
    return reason if reason.startswith(state.split(maxsplit=1)[0]) else f"{state} ({reason})"


def device_condition(device: DeviceRun, last_seen: datetime | None) -> str:
    """Why a device takes no work now, in words: its operator's state, then its liveness."""
    parts = []
    if device.admin is AdminState.STOPPED:
        parts.append(_said("stopped by an operator", device.stop_reason))
    elif device.admin is AdminState.CORDONED:
        parts.append(_said("cordoned", device.cordon_reason))
    elif device.admin is AdminState.DRAINING:
        parts.append("draining (it finishes its work and takes no new work)")
    if device.liveness is Liveness.OFFLINE:
        since = f" since {last_seen.astimezone(UTC).isoformat(timespec='seconds')}" if last_seen else ""
        parts.append(f"offline{since} (its agent is not connected)")
    elif device.liveness is Liveness.SUSPECT:
        parts.append("suspect (its heartbeats stopped; it goes offline at the heartbeat timeout)")
    elif device.liveness is Liveness.ENROLLED:
        parts.append("never connected")
    return " and ".join(parts) or "not taking work"


async def device_policies(store: Store) -> dict[str, Any]:
    """Each device's policy as its agent reported it (`hello.info.policy`), by device id."""
    return {row.id: (row.info or {}).get("policy") for row in await store.list_devices()}


async def dry_run(store: Store, cluster: Cluster, settings: Settings, body: TaskCreate) -> dict[str, Any]:
    """`POST /v1/tasks?dry_run=true`: every check a submission makes, placement per node and what
    the devices' reported policies would refuse; nothing is stored (SPEC section 3)."""
    spec = body.dag
    llm = settings.llm_configured
    if spec is None:
        problems = [] if llm else [_no_llm("this server has no LLM configured; submit an explicit 'dag'")]
        return {"valid": not problems, "problems": problems, "warnings": [], "nodes": []}
    if refused := nul_problems(spec):
        return {"valid": False, "problems": [p.as_dict() for p in refused], "warnings": [], "nodes": []}
    devices = await cluster.devices(fresh=True)
    policies = await device_policies(store)
    answer = validation.dry_run(spec, devices, settings.dag_limits, policies)
    answer["warnings"] += await waiting_warnings(store, spec, devices, settings.queue_timeout_s)
    listed = [Problem(p["code"], p["message"], p) for p in answer["problems"]]
    hinted = never_connected_hints(listed, spec, devices)
    for problem, out in zip(hinted, answer["problems"], strict=True):
        out["message"] = problem.message
    if not llm and any(n.kind is NodeKind.AGENT for n in spec.nodes):
        answer["problems"].insert(0, _no_llm("agent nodes need an LLM and this server has none configured"))
        answer["valid"] = False
    return answer


MAX_NUL_PROBLEMS = 20


def nul_problems(spec: DagSpec) -> list[Problem]:
    """Every string of the DAG (keys too) with a NUL character, as `validation_error` with the field's
    path: Postgres cannot store such text. A command's arguments are left to its tool's schema
    (`domain/checks.py`): built-in tools refuse a NUL where it would reach the OS (argv, paths, cwd,
    env) with `invalid_arguments`, and take it in data (file content, stdin)."""
    try:
        if "\\u0000" not in spec.model_dump_json(by_alias=True):
            return []  # no string holds a NUL (JSON text writes one as \u0000): nothing to walk
    except ValueError:  # something the JSON serializer will not take: the walk below decides
        pass
    problems: list[Problem] = []
    data = spec.model_dump(mode="json", by_alias=True)
    for path in _nul_paths(data, []):
        if len(problems) >= MAX_NUL_PROBLEMS:
            break
        if len(path) > 4 and path[0] == "nodes" and path[2] == "commands" and path[4] == "arguments":
            continue  # the tool's schema decides (checks.py): a path or argv may not hold a NUL, file content may
        where = _dotted(["dag", *path])
        extra: dict[str, Any] = {"field": where}
        if path[0] == "nodes" and len(path) > 1:
            extra["node_id"] = data["nodes"][int(path[1])]["id"]
        problems.append(Problem("validation_error", f"'{where}' contains a NUL character (U+0000)", extra))
    return problems


def _nul_paths(value: Any, path: list[str]) -> Iterator[list[str]]:
    if isinstance(value, str):
        if "\x00" in value:
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _nul_paths(key, [*path, str(key)])
            yield from _nul_paths(item, [*path, str(key)])
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from _nul_paths(item, [*path, str(n)])


def _dotted(path: list[str]) -> str:
    return ".".join(path).replace("\x00", "\\u0000")


def _no_llm(message: str) -> dict[str, Any]:
    return {"code": "planner_unavailable", "message": message}


def _same_or_conflict(task_id: str, earlier_hash: str | None, digest: str) -> tuple[str, NewTask | None]:
    if earlier_hash != digest:
        raise ApiError(
            409,
            "conflict",
            f"Idempotency-Key was already used for task {task_id} with a different body",
            task_id=task_id,
        )
    return task_id, None
