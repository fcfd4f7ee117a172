"""Accepting a task: idempotency, validation against the fleet, then the engine stores it."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.api.errors import ApiError
from orchestrator.api.render import NewTask
from orchestrator.api.schemas import TaskCreate
from orchestrator.cluster import Cluster
from orchestrator.config import Settings
from orchestrator.domain.model import DagSpec, NodeKind
from orchestrator.domain.problems import DomainError, Problem
from orchestrator.engine import validation
from orchestrator.engine.intake import Admission, KeptNode, Submission
from orchestrator.engine.records import SubmitTask
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
            await _warn(cluster, body, warnings)
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
            raise DomainError(problems)
        if warnings is not None:
            warnings += [w.as_dict() for w in warnings_against(spec, devices)]
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


async def _warn(cluster: Cluster, body: TaskCreate, warnings: list[dict[str, str]] | None) -> None:
    if warnings is not None and body.dag is not None:
        warnings += [w.as_dict() for w in warnings_against(body.dag, await cluster.devices())]


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
    devices = await cluster.devices()
    policies = await device_policies(store)
    answer = validation.dry_run(spec, devices, settings.dag_limits, policies)
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
