"""Finding the task, device, schedule or approval a path names: full id, unique id prefix, or name."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from orchestrator.api.errors import ApiError
from orchestrator.store import schedules as stored_schedules
from orchestrator.store.models import Approval, Device, Schedule, Task
from orchestrator.store.repo import MAX_CANDIDATES, MIN_PREFIX, Store, id_prefix


async def find_task(store: Store, ref: str) -> Task:
    """The task `ref` names: its id, a unique id prefix (at least 4 characters) or its name
    (the newest task of that name). 409 `ambiguous_id` names the candidates; 404 `not_found`."""
    check_ref("task", ref)
    row, candidates = await store.resolve_task(ref)
    if row is not None:
        return row
    _refuse("task", ref, [{"id": t.id, "name": t.name} for t in candidates])
    raise AssertionError  # unreachable


async def find_device(store: Store, ref: str) -> Device:
    """The device `ref` names: its id, a unique id prefix (at least 4 characters) or its name
    (the device of that name that is not revoked); errors as `find_task`."""
    check_ref("device", ref)
    row, candidates = await store.resolve_device(ref)
    if row is not None:
        return row
    _refuse("device", ref, [{"id": d.id, "name": d.name} for d in candidates])
    raise AssertionError  # unreachable


async def find_schedule(store: Store, ref: str) -> Schedule:
    """The schedule `ref` names: its id, a unique id prefix (at least 4 characters) or its name;
    errors as `find_task`."""
    check_ref("schedule", ref)
    row, candidates = await stored_schedules.resolve(store, ref)
    if row is not None:
        return row
    _refuse("schedule", ref, [{"id": s.id, "name": s.name} for s in candidates])
    raise AssertionError  # unreachable


async def find_approval(store: Store, ref: str) -> Approval:
    """The approval `ref` names: its id or a unique id prefix (at least 4 characters, with or
    without `apr_`); 409 `ambiguous_id` names the candidates (by tool); 404 `not_found` points
    at `orrery approvals list`."""
    check_ref("approval", ref)
    async with store.sessions() as s:
        row = await s.get(Approval, ref)
        if row is not None:
            return row
        rows: list[Approval] = []
        if len(ref) >= MIN_PREFIX:
            q = select(Approval).where(id_prefix(Approval.id, ref, "apr")).order_by(Approval.id).limit(MAX_CANDIDATES)
            rows = list((await s.execute(q)).scalars())
    if len(rows) == 1:
        return rows[0]
    _refuse(
        "approval", ref, [{"id": a.id, "name": a.tool} for a in rows], hint="; list them with 'orrery approvals list'"
    )
    raise AssertionError  # unreachable


def check_ref(kind: str, ref: str) -> None:
    """404 for a reference no id or name can be: one with a NUL (a path's "%00"). It never
    reaches the store (Postgres cannot even compare such a string; SQLite answers the same)."""
    if "\x00" in ref:
        shown = ref.replace("\x00", "\\u0000")
        raise ApiError(404, "not_found", f"no {kind} '{shown}' (no id or name contains a NUL character)")


def _refuse(kind: str, ref: str, candidates: list[dict[str, Any]], hint: str = "") -> None:
    if candidates:
        names = ", ".join(f"{c['id']} ({c['name']})" for c in candidates)
        raise ApiError(
            409,
            "ambiguous_id",
            f"'{ref}' matches more than one {kind}: {names}; give more of the id",
            candidates=candidates,
        )
    short = f" (an id prefix needs at least {MIN_PREFIX} characters)" if len(ref) < MIN_PREFIX else ""
    raise ApiError(404, "not_found", f"no {kind} '{ref}'{short}{hint}")
