"""`/v1/devices`: enroll, list, get, label, rotate the token, drain, cordon, uncordon, stop,
resume, revoke, history and recent attempts (SPEC section 3). Every `{device_id}` is an id, a unique id prefix
or the device's name (see `orchestrator.api.lookup`)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from orchestrator.api.deps import Admin, Comp, Operator, Principal, Viewer
from orchestrator.api.errors import COMMON, LISTING, ApiError, problems
from orchestrator.api.lookup import find_device
from orchestrator.api.render import device_out
from orchestrator.api.schemas import (
    MAX_LABELS,
    DeviceAttemptItem,
    DeviceEnroll,
    DeviceEnrolled,
    DeviceHandbackIn,
    DeviceHistoryItem,
    DeviceOut,
    DevicePatch,
    DeviceStopIn,
    DeviceTakeoverIn,
    Page,
)
from orchestrator.domain.controls import ControlAction
from orchestrator.domain.model import AdminState
from orchestrator.engine.controls import controls_of
from orchestrator.engine.records import ControlDevice, DeviceChanged
from orchestrator.engine.times import utc
from orchestrator.ids import new_id
from orchestrator.security import device_token
from orchestrator.store.models import Device, DeviceHistory
from orchestrator.store.repo import ChangeSet, WriteConflict
from protocol.messages import FEATURE_VIEW

router = APIRouter(prefix="/v1/devices", tags=["devices"], responses={**COMMON, **problems(404, 409)})


@router.post(
    "",
    status_code=201,
    response_model=DeviceEnrolled,
    responses=problems(s409="`conflict`: a device of that name is enrolled (revoke it first to reuse the name)"),
)
async def enroll(body: DeviceEnroll, comp: Comp, _p: Admin) -> DeviceEnrolled:
    taken = f"a device named '{body.name}' is already enrolled (revoke it first to reuse the name)"
    if await comp.store.find_device_by_name(body.name) is not None:
        raise ApiError(409, "conflict", taken)
    device_id = new_id("dev")
    token = device_token(device_id)
    now = time.time()
    row = {
        "id": device_id,
        "name": body.name,
        "token_hash": comp.hasher.digest(token),
        "labels": body.labels,
        "reported_labels": {},
        "platform": "other",
        "info": {},
        "tools": [],
        "admin_state": AdminState.ACTIVE.value,
        "liveness": "enrolled",
        "fence": 0,
        "current_batch_id": None,
        "created_at": utc(now),
        "last_seen": None,
    }
    changes = ChangeSet()
    changes.insert(Device, row)
    changes.insert(DeviceHistory, _history(device_id, "enrolled", "enrolled by an admin", now))
    try:
        await comp.store.write(changes)  # the name's unique index decides between concurrent enrollments
    except WriteConflict:
        raise ApiError(409, "conflict", taken) from None
    await comp.cluster.submit(DeviceChanged(device_id))
    return DeviceEnrolled(id=device_id, name=body.name, token=token)


@router.get("", response_model=Page)
async def list_devices(comp: Comp, _p: Viewer) -> Page:
    rows = await comp.store.list_devices()
    queues = await comp.store.queue_lengths()
    work = await comp.store.current_work([r.current_batch_id for r in rows if r.current_batch_id])
    return Page(items=[_out(comp, r, queues.get(r.id, 0), work) for r in rows])


@router.get("/{device_id}", response_model=DeviceOut)
async def get_device(device_id: str, comp: Comp, _p: Viewer) -> DeviceOut:
    return await _detail(comp, await find_device(comp.store, device_id))


@router.patch("/{device_id}", response_model=DeviceOut)
async def patch_device(device_id: str, body: DevicePatch, comp: Comp, _p: Operator) -> DeviceOut:
    """Merge `labels` into the device's enrollment labels (a null value deletes one). Placement
    uses the new labels from the answer on."""
    row = await _usable(comp, device_id)
    labels = dict(row.labels or {})
    for key, value in body.labels.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    if len(labels) > MAX_LABELS:
        raise ApiError(
            422, "validation_error", f"a device has at most {MAX_LABELS} labels; this would make {len(labels)}"
        )
    await comp.store.update(Device, (row.id,), labels=labels)
    await comp.cluster.submit(DeviceChanged(row.id))
    return await _detail(comp, await find_device(comp.store, row.id))


@router.post("/{device_id}/token", response_model=DeviceEnrolled)
async def rotate_token(device_id: str, comp: Comp, _p: Admin) -> DeviceEnrolled:
    """A new token for the device. The old one stops working now, and a connection opened with
    it is closed (4401): restart the agent with the new token."""
    row = await _usable(comp, device_id)
    token = device_token(row.id)
    await comp.store.update(Device, (row.id,), token_hash=comp.hasher.digest(token))
    await comp.cluster.submit(DeviceChanged(row.id))
    return DeviceEnrolled(id=row.id, name=row.name, token=token)


@router.get("/{device_id}/history", response_model=Page, responses=LISTING)
async def history(
    device_id: str,
    comp: Comp,
    _p: Viewer,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Page:
    """Every change of the device's state (liveness and admin), newest first."""
    row = await find_device(comp.store, device_id)
    rows, nxt = await comp.store.device_history(row.id, limit, cursor)
    items = [DeviceHistoryItem(state=h.state, reason=h.reason, at=h.at) for h in rows]
    return Page(items=items, next_cursor=nxt)


@router.get("/{device_id}/attempts", response_model=Page, responses=LISTING)
async def attempts(
    device_id: str,
    comp: Comp,
    _p: Viewer,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Page:
    """The batches sent to the device, newest first."""
    row = await find_device(comp.store, device_id)
    rows, nxt = await comp.store.device_attempts(row.id, limit, cursor)
    items = [
        DeviceAttemptItem(
            task_id=a.task_id,
            task_name=name,
            node_id=a.node_id,
            n=a.n,
            batch_id=a.batch_id,
            kind=a.kind,
            status=a.status,
            started_at=a.started_at,
            ended_at=a.ended_at,
            error=a.error,
        )
        for a, name in rows
    ]
    return Page(items=items, next_cursor=nxt)


_STOPPED_409 = "`conflict`: the device is revoked, or (drain, cordon, uncordon) stopped: resume it first"


@router.post("/{device_id}/drain", response_model=DeviceOut, responses=problems(s409=_STOPPED_409))
async def drain(device_id: str, comp: Comp, _p: Operator) -> DeviceOut:
    return await _control(comp, device_id, ControlAction.DRAIN, "drained by an operator")


@router.post("/{device_id}/cordon", response_model=DeviceOut, responses=problems(s409=_STOPPED_409))
async def cordon(device_id: str, comp: Comp, _p: Operator) -> DeviceOut:
    """Take no new work; `cordon_reason` says "cordoned by an operator". (A device whose agent
    breaches one of its safety budgets is cordoned by the engine, the breach as its reason.)"""
    return await _control(comp, device_id, ControlAction.CORDON, "cordoned by an operator")


@router.post("/{device_id}/uncordon", response_model=DeviceOut, responses=problems(s409=_STOPPED_409))
async def uncordon(device_id: str, comp: Comp, _p: Operator) -> DeviceOut:
    """Back to service; clears `cordon_reason`, and the device's agent resets its safety budgets,
    so a device cordoned by a breach takes work again."""
    return await _control(comp, device_id, ControlAction.UNCORDON, "uncordoned by an operator", guarded=True)


@router.post(
    "/{device_id}/stop", response_model=DeviceOut, responses=problems(s409="`conflict`: the device is revoked")
)
async def stop(device_id: str, comp: Comp, principal: Operator, body: DeviceStopIn | None = None) -> DeviceOut:
    """Emergency stop. The device takes no new work (its queued nodes go back to be placed
    elsewhere), its running batch is stopped at once (process groups killed, held GUI buttons
    and modifiers released; the stopped commands end with error code `device_stopped`, and the
    node fails or is retried by the usual retry rules), and its agent refuses every action tool
    (read-only tools still run) until `POST /v1/devices/{id}/resume`. The stop is durable: it
    outlasts agent and orchestrator restarts, and it is sent to the agent until the agent
    reports it applied (an agent that was offline learns it when it reconnects). The history
    entry records who stopped the device and why. Stopping a stopped device changes nothing."""
    reason = (body.reason if body else "").strip()
    why = _by("stopped", principal) + (f": {reason}" if reason else "")
    return await _control(comp, device_id, ControlAction.STOP, why)


@router.post(
    "/{device_id}/resume",
    response_model=DeviceOut,
    responses=problems(s409="`conflict`: the device is revoked, or its controls changed since it was read"),
)
async def resume(device_id: str, comp: Comp, principal: Operator) -> DeviceOut:
    """Lift an emergency stop: the device is `active` again (takes work, its agent runs action
    tools again; a GUI needs a new `gui.observe` first), or `cordoned` if its agent breached a
    safety budget meanwhile (uncordon it to reset them). The only way to lift a stop. On a
    device that is not stopped its state does not change, but its agent is still told to
    resume: that lifts a `gui.stop` a model called (no tool can lift it)."""
    return await _control(comp, device_id, ControlAction.RESUME, _by("resumed", principal), guarded=True)


_TAKEOVER_409 = (
    "`conflict`: the device is revoked or stopped, or someone else has it taken over; "
    "`takeover_unsupported`: its agent cannot be taken over (an older version)"
)


@router.post("/{device_id}/takeover", response_model=DeviceOut, responses=problems(s409=_TAKEOVER_409))
async def takeover(device_id: str, comp: Comp, principal: Operator, body: DeviceTakeoverIn | None = None) -> DeviceOut:
    """Take the device over: a person has its screen until `POST .../handback`. Its agent nodes
    pause before their next action (node state `taken_over`; the time does not count against their
    `timeout_s`), it takes no new work (its queue waits), and its agent refuses the model's input
    tools; the person acts through the live view (`POST .../input`) or at the device. Durable and
    reconciled like a stop: it outlasts reconnects and restarts. An emergency stop ends it.
    Taking over a device you have taken over already changes nothing."""
    row = await _usable(comp, device_id)
    if FEATURE_VIEW not in ((row.info or {}).get("features") or ()):
        raise ApiError(
            409,
            "takeover_unsupported",
            f"device '{row.name}' cannot be taken over: its agent has not announced a live view (it has no "
            "screen, is an older version, or has never connected)",
        )
    reason = (body.reason if body else "").strip()
    return await _control(comp, device_id, ControlAction.TAKEOVER, reason, by=principal.operator)


@router.post("/{device_id}/handback", response_model=DeviceOut, responses=problems(s409=_STOPPED_409))
async def handback(device_id: str, comp: Comp, principal: Operator, body: DeviceHandbackIn | None = None) -> DeviceOut:
    """Hand the device back to its tasks with a note. Its paused agent nodes go on: the model reads
    the note and must observe the screen again before it acts (its last observation is void); a
    question it asked a person (`approval.ask_person`) is answered with the note. Handing back a
    device nobody has taken over changes nothing (an owner's takeover is handed back at the device)."""
    note = (body.note if body else "").strip()
    return await _control(comp, device_id, ControlAction.HANDBACK, note, by=principal.operator)


@router.delete("/{device_id}", status_code=200)
async def revoke(device_id: str, comp: Comp, _p: Admin) -> dict[str, Any]:
    out = await _control(comp, device_id, ControlAction.REVOKE, "revoked by an admin")
    return {"id": out.id, "state": "revoked"}


async def _usable(comp: Comp, device_id: str) -> Device:
    row = await find_device(comp.store, device_id)
    if row.admin_state == AdminState.REVOKED:
        raise ApiError(409, "conflict", f"device '{row.name}' is revoked; enroll it again to use it")
    return row


def _by(done: str, principal: Principal) -> str:
    return f"{done} by {principal.operator}"


async def _control(
    comp: Comp, device_id: str, action: ControlAction, why: str, guarded: bool = False, by: str = ""
) -> DeviceOut:
    """Ask the engine, the one writer of a device's controls, for `action`. `guarded` (resume,
    uncordon): only on the controls this request read, so a repeated or stale request cannot
    lift a stop given since."""
    row = await _usable(comp, device_id)
    expect = controls_of(row).gen if guarded else None
    reply = await comp.cluster.submit(ControlDevice(row.id, action, why, new_id("req"), expect, by))
    if not reply.get("ok"):
        code = str(reply.get("code") or "conflict")
        raise ApiError(404 if code == "not_found" else 409, code, str(reply.get("detail") or ""))
    await comp.store.prune_device_history([row.id], comp.settings.device_history_kept)
    return await _detail(comp, await find_device(comp.store, row.id))


def _history(device_id: str, state: str, reason: str, now: float) -> dict[str, Any]:
    return {"device_id": device_id, "state": state, "reason": reason, "at": utc(now)}


async def _detail(comp: Comp, row: Device) -> DeviceOut:
    queues = await comp.store.queue_lengths()
    work = await comp.store.current_work([row.current_batch_id] if row.current_batch_id else [])
    out = _out(comp, row, queues.get(row.id, 0), work)
    if row.admin_state == AdminState.STOPPED:
        out.stop_reason = controls_of(row).stop_reason
    return out


def _out(comp: Comp, row: Device, queue: int, work: dict[str, tuple[str, str]]) -> DeviceOut:
    gw = comp.gateway
    current = work.get(row.current_batch_id or "")
    return device_out(row, queue, gw.is_connected(row.id), gw.last_seen_monotonic(row.id), current)
