"""Store rows to API response models."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import TypeAdapter

from orchestrator.api.schemas import AttemptOut, DeviceOut, EdgeOut, NodeOut, TakeoverOut, TaskOut, WarningOut
from orchestrator.domain.lifecycle import device_state
from orchestrator.domain.model import AdminState, Liveness
from orchestrator.store.models import Device, Task
from orchestrator.store.repo import VIEW_ATTEMPT_COLUMNS, VIEW_CHILD_COLUMNS, VIEW_NODE_COLUMNS, TaskBundle, TaskRows


def task_out(task: Task, counts: dict[str, int] | None = None) -> TaskOut:
    return TaskOut(
        id=task.id,
        name=task.name,
        state=task.state,
        priority=task.priority,
        labels=task.labels or {},
        request=task.request,
        created_at=task.created_at,
        finished_at=task.finished_at,
        error=task.error,
        dag_version=task.dag_version or 1,
        rerun_of=task.rerun_of,
        node_counts=counts or {},
    )


@dataclass(frozen=True)
class NewTask:
    """A task just created, as the rows handed to the engine to store: the answer to its submission
    is rendered from them (building thousands of ORM objects only to read them back costs more
    than the checks of the DAG)."""

    task: dict[str, Any]
    nodes: list[dict[str, Any]]  # without output, results and error unless a re-run kept them
    edges: list[dict[str, Any]]


_NODES = TypeAdapter(list[NodeOut])
_EDGES = TypeAdapter(list[EdgeOut])


Parts = tuple[Any, list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]


def _parts(bundle: TaskBundle | TaskRows | NewTask) -> Parts:
    """The task (a row or an ORM object), its node rows, edges, attempt rows and fan-out child
    rows, as plain dicts."""
    if isinstance(bundle, NewTask):
        return bundle.task, bundle.nodes, bundle.edges, [], []
    if isinstance(bundle, TaskRows):
        edges = [{"source": e["source"], "target": e["target"], "on": e["on"]} for e in bundle.edges]
        return bundle.task, bundle.nodes, edges, bundle.attempts, bundle.children
    rows = [{f: getattr(n, f) for f in VIEW_NODE_COLUMNS} for n in bundle.nodes]
    edges = [{"source": e.source, "target": e.target, "on": e.on} for e in bundle.edges]
    attempts = [{f: getattr(a, f) for f in VIEW_ATTEMPT_COLUMNS} for a in bundle.attempts]
    children = [{f: getattr(c, f) for f in VIEW_CHILD_COLUMNS} for c in bundle.children]
    return bundle.task, rows, edges, attempts, children


def _attempt_fields(a: dict[str, Any]) -> dict[str, Any]:
    """An attempt row as `AttemptOut`'s fields, in its order."""
    return {
        "n": a["n"],
        "device_id": a["device_id"],
        "batch_id": a["batch_id"],
        "status": a["status"],
        "started_at": a["started_at"],
        "accepted_at": a["accepted_at"],
        "ended_at": a["ended_at"],
        "commands": a["commands"] or [],
        "results": a["results"] or [],
        "error": a["error"],
        "kind": a.get("kind") or "tool",
    }


def _child_dicts(children: list[dict[str, Any]], by_node: dict[str, list[Any]], device: Any) -> dict[str, list[Any]]:
    """Each node's fan-out children as `ChildOut`'s fields, in rollout order, each with the
    attempts of its node on its device (taken out of `by_node`; `device(attempt)` reads an
    attempt's device id, whether the attempt is a dict or a model)."""
    out: dict[str, list[Any]] = {}
    taken: set[str] = set()
    for c in children:
        node_id = c["node_id"]
        own = [a for a in by_node.get(node_id, []) if device(a) == c["device_id"]]
        taken.add(node_id)
        out.setdefault(node_id, []).append(
            {
                "device_id": c["device_id"],
                "device": c["device_name"],
                "state": c["state"],
                "queued_on": c.get("queued_on"),
                "attempts": own,
                "output": c.get("output"),
                "error": c.get("error"),
                "verification": c.get("verification"),
                "started_at": c.get("started_at"),
                "finished_at": c.get("finished_at"),
            }
        )
    for node_id in taken:
        by_node[node_id] = []  # a fan-out node's attempts are its children's
    return out


def _node_dicts(
    rows: list[dict[str, Any]], by_node: dict[str, list[Any]], kids: dict[str, list[Any]] | None = None
) -> list[dict[str, Any]]:
    """Each node row as `NodeOut`'s fields, in its order; `by_node`: the node's attempts; `kids`:
    a fan-out node's children."""
    kids = kids or {}
    nodes = []
    for n in rows:
        spec: dict[str, Any] = n["spec"]
        fans_out = spec.get("for_each") is not None
        nodes.append(
            {
                "id": n["id"],
                "kind": n["kind"],
                "state": n["state"],
                "placement": spec.get("placement", {}),
                "commands": spec.get("commands", []),
                "instruction": spec.get("instruction"),
                "retry": spec.get("retry", {}),
                "priority": spec.get("priority", 0),
                "queue_timeout_s": spec.get("queue_timeout_s"),
                "timeout_s": spec.get("timeout_s"),
                "queued_on": n.get("queued_on"),
                "attempts": by_node.get(n["id"], []),
                "output": n.get("output"),
                "error": n.get("error"),
                "started_at": n.get("started_at"),
                "finished_at": n.get("finished_at"),
                "for_each": spec.get("for_each"),
                "verify": spec.get("verify") or [],
                "verification": n.get("verification"),
                "fan_out": n.get("fan_out"),
                "children": kids.get(n["id"], []) if fans_out else None,
            }
        )
    return nodes


def _counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return counts


def task_detail(bundle: TaskBundle | TaskRows | NewTask) -> TaskOut:
    task, rows, edges, attempts, children = _parts(bundle)
    out = task_out(Task(**task) if isinstance(task, dict) else task, _counts(rows))
    by_node: dict[str, list[Any]] = {}
    for a in attempts:
        by_node.setdefault(a["node_id"], []).append(AttemptOut(**_attempt_fields(a)))
    kids = _child_dicts(children, by_node, lambda a: a.device_id)
    out.nodes = _NODES.validate_python(_node_dicts(rows, by_node, kids))  # one validation of the list
    out.edges = _EDGES.validate_python(edges)
    return out


class _NotPlain(Exception):
    """A value the plain rendering does not reproduce exactly as the models would: use them."""


def _when(value: Any) -> datetime | None:
    if value is None or type(value) is datetime:
        return value
    raise _NotPlain


def _seconds(value: Any) -> float | None:
    if value is None or type(value) is float:
        return value
    if type(value) is int:
        return float(value)  # what `float | None` makes of it
    raise _NotPlain


def _whole(value: Any) -> int:
    if type(value) is int:
        return value
    raise _NotPlain


def task_json(bundle: TaskBundle | TaskRows | NewTask, warnings: list[dict[str, Any]] | None = None) -> bytes:
    """`task_detail(bundle)` as JSON (by alias, `warnings` set), the same bytes, without the
    models. A 2,000-node task is 2.4 MB of JSON: validating it into ~4,000 models and dumping them
    again was most of a GET. The fields are `TaskOut`'s, `NodeOut`'s and `AttemptOut`'s, in their
    order, with their conversions (`float` fields given an int write it as a float); the values
    came from the store, so they are JSON's own types. Anything else (an int over 64 bits, a type
    a conversion here does not cover) is rendered through the models, as before; a test holds the
    two to the same bytes."""
    task, rows, edges, attempts, children = _parts(bundle)
    field = task.get if isinstance(task, dict) else lambda name: getattr(task, name)
    try:
        by_node: dict[str, list[Any]] = {}
        for a in attempts:
            fields = _attempt_fields(a)
            _whole(fields["n"])  # checks only: an int and a datetime are written as they are
            for name in ("started_at", "accepted_at", "ended_at"):
                _when(fields[name])
            by_node.setdefault(a["node_id"], []).append(fields)
        kids = _child_dicts(children, by_node, lambda a: a["device_id"])
        for child in (c for group in kids.values() for c in group):
            child["started_at"] = _when(child["started_at"])
            child["finished_at"] = _when(child["finished_at"])
        nodes = _node_dicts(rows, by_node, kids)
        for n in nodes:
            n["priority"] = _whole(n["priority"])
            n["queue_timeout_s"] = _seconds(n["queue_timeout_s"])
            n["timeout_s"] = _seconds(n["timeout_s"])
            n["started_at"] = _when(n["started_at"])
            n["finished_at"] = _when(n["finished_at"])
        answer = {
            "id": field("id"),
            "name": field("name"),
            "state": field("state"),
            "priority": _whole(field("priority")),
            "labels": field("labels") or {},
            "request": field("request"),
            "created_at": _when(field("created_at")),
            "finished_at": _when(field("finished_at")),
            "error": field("error"),
            "dag_version": _whole(field("dag_version") or 1),
            "rerun_of": field("rerun_of"),
            "node_counts": _counts(rows),
            "nodes": nodes,
            "edges": [{"from": e["source"], "to": e["target"], "on": e["on"]} for e in edges],
            "warnings": warnings or [],
        }
        return orjson.dumps(answer, option=orjson.OPT_UTC_Z)
    except (_NotPlain, TypeError):  # orjson.JSONEncodeError is a TypeError
        out = task_detail(bundle)
        out.warnings = [WarningOut.model_validate(w) for w in warnings or []]
        return out.model_dump_json(by_alias=True).encode()


def device_out(
    row: Device,
    queue_length: int,
    connected: bool,
    last_frame_mono: float | None,
    current: tuple[str, str] | None = None,
) -> DeviceOut:
    """`current`: (task id, node id) of the batch the device runs now, if known."""
    last_seen = row.last_seen
    if last_frame_mono is not None:
        last_seen = datetime.fromtimestamp(time.time() - (time.monotonic() - last_frame_mono), UTC)
    state = device_state(
        AdminState(row.admin_state), Liveness(row.liveness), row.current_batch_id is not None, queue_length
    )
    if row.current_batch_id is None:
        current = None
    return DeviceOut(
        id=row.id,
        name=row.name,
        state=state.value,
        admin_state=row.admin_state,
        liveness=row.liveness,
        labels={**(row.reported_labels or {}), **(row.labels or {})},
        platform=row.platform,
        info=row.info or {},
        tools=row.tools or [],
        current_batch=row.current_batch_id,
        current_task_id=current[0] if current else None,
        current_node_id=current[1] if current else None,
        queue_length=queue_length,
        last_seen=last_seen,
        connected=connected,
        created_at=row.created_at,
        cordon_reason=row.cordon_reason if row.admin_state == AdminState.CORDONED else None,
        control_generation=int((row.control or {}).get("gen") or 0),
        control_applied=int((row.control or {}).get("applied") or 0),
        takeover=takeover_out(row.control or {}),
    )


def takeover_out(control: dict[str, Any]) -> TakeoverOut | None:
    """Who has the device, from its `control` column: an operator's takeover first."""
    if control.get("taken_over_by"):
        since = float(control.get("takeover_since") or 0.0)
        return TakeoverOut(
            source="operator",
            by=str(control["taken_over_by"]),
            since=datetime.fromtimestamp(since, UTC) if since else None,
            reason=str(control.get("takeover_reason") or ""),
        )
    owner = control.get("owner_takeover")
    if owner:
        since = float(owner.get("since") or 0.0)
        return TakeoverOut(
            source="owner",
            by=str(owner.get("by") or "the device's owner"),
            since=datetime.fromtimestamp(since, UTC) if since else None,
        )
    return None
