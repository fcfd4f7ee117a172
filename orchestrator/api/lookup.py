"""Finding the task or device a path names: full id, unique id prefix, or name."""

from __future__ import annotations

from typing import Any

from orchestrator.api.errors import ApiError
from orchestrator.store import schedules as stored_schedules
from orchestrator.store.models import Device, Schedule, Task
from orchestrator.store.repo import MIN_PREFIX, Store


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


def check_ref(kind: str, ref: str) -> None:
    """404 for a reference no id or name can be: one with a NUL (a path's "%00"). It never
    reaches the store (Postgres cannot even compare such a string; SQLite answers the same)."""
    if "\x00" in ref:
        shown = ref.replace("\x00", "\\u0000")
        raise ApiError(404, "not_found", f"no {kind} '{shown}' (no id or name contains a NUL character)")


def _refuse(kind: str, ref: str, candidates: list[dict[str, Any]]) -> None:
    if candidates:
        names = ", ".join(f"{c['id']} ({c['name']})" for c in candidates)
        raise ApiError(
            409,
            "ambiguous_id",
            f"'{ref}' matches more than one {kind}: {names}; give more of the id",
            candidates=candidates,
        )
    hint = f" (an id prefix needs at least {MIN_PREFIX} characters)" if len(ref) < MIN_PREFIX else ""
    raise ApiError(404, "not_found", f"no {kind} '{ref}'{hint}")
