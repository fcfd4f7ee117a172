"""`/v1/devices`: enroll, list, get, drain, cordon, uncordon, revoke (SPEC section 3)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from orchestrator.api.deps import Admin, Comp, Operator, Viewer
from orchestrator.api.errors import COMMON, ApiError, problems
from orchestrator.api.render import device_out
from orchestrator.api.schemas import DeviceEnroll, DeviceEnrolled, DeviceOut, Page
from orchestrator.domain.model import AdminState
from orchestrator.engine.records import DeviceChanged
from orchestrator.engine.times import utc
from orchestrator.ids import new_id
from orchestrator.security import device_token
from orchestrator.store.models import Device
from orchestrator.store.repo import WriteConflict

router = APIRouter(prefix="/v1/devices", tags=["devices"], responses={**COMMON, **problems(404, 409)})


@router.post("", status_code=201, response_model=DeviceEnrolled)
async def enroll(body: DeviceEnroll, comp: Comp, _p: Admin) -> DeviceEnrolled:
    if await comp.store.find_device_by_name(body.name) is not None:
        raise ApiError(409, "conflict", f"a device named '{body.name}' is already enrolled")
    device_id = new_id("dev")
    token = device_token(device_id)
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
        "created_at": utc(time.time()),
        "last_seen": None,
    }
    try:
        await comp.store.add(Device, row)
    except WriteConflict:
        raise ApiError(409, "conflict", f"a device named '{body.name}' is already enrolled") from None
    await comp.cluster.submit(DeviceChanged(device_id))
    return DeviceEnrolled(id=device_id, name=body.name, token=token)


@router.get("", response_model=Page)
async def list_devices(comp: Comp, _p: Viewer) -> Page:
    rows = await comp.store.list_devices()
    queues = await comp.store.queue_lengths()
    return Page(items=[_out(comp, r, queues.get(r.id, 0)) for r in rows])


@router.get("/{device_id}", response_model=DeviceOut)
async def get_device(device_id: str, comp: Comp, _p: Viewer) -> DeviceOut:
    return await _detail(comp, await _row(comp, device_id))


@router.post("/{device_id}/drain", response_model=DeviceOut)
async def drain(device_id: str, comp: Comp, _p: Operator) -> DeviceOut:
    return await _set_admin(comp, device_id, AdminState.DRAINING)


@router.post("/{device_id}/cordon", response_model=DeviceOut)
async def cordon(device_id: str, comp: Comp, _p: Operator) -> DeviceOut:
    return await _set_admin(comp, device_id, AdminState.CORDONED)


@router.post("/{device_id}/uncordon", response_model=DeviceOut)
async def uncordon(device_id: str, comp: Comp, _p: Operator) -> DeviceOut:
    return await _set_admin(comp, device_id, AdminState.ACTIVE)


@router.delete("/{device_id}", status_code=200)
async def revoke(device_id: str, comp: Comp, _p: Admin) -> dict[str, Any]:
    await _set_admin(comp, device_id, AdminState.REVOKED)
    return {"id": device_id, "state": "revoked"}


async def _set_admin(comp: Comp, device_id: str, admin: AdminState) -> DeviceOut:
    row = await _row(comp, device_id)
    if row.admin_state == AdminState.REVOKED:
        raise ApiError(409, "conflict", f"device '{row.name}' is revoked; enroll it again to use it")
    await comp.store.update(Device, (row.id,), admin_state=admin.value)
    await comp.cluster.submit(DeviceChanged(row.id))
    return await _detail(comp, await _row(comp, row.id))


async def _row(comp: Comp, device_id: str) -> Device:
    row = await comp.store.get_device(device_id)
    if row is None:
        row = await comp.store.find_device_by_name(device_id)
    if row is None:
        raise ApiError(404, "not_found", f"no device '{device_id}'")
    return row


async def _detail(comp: Comp, row: Device) -> DeviceOut:
    queues = await comp.store.queue_lengths()
    return _out(comp, row, queues.get(row.id, 0))


def _out(comp: Comp, row: Device, queue: int) -> DeviceOut:
    gw = comp.gateway
    return device_out(row, queue, gw.is_connected(row.id), gw.last_seen_monotonic(row.id))
