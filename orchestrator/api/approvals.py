"""`/v1/approvals`: commands waiting for a person's decision, and the decisions.

A device asks before a command on its `approval_required` list runs (or when a model calls
`approval.request`); its node shows `waiting_approval`. An operator approves (the command runs)
or denies it (the node fails with `approval_denied`; the command never ran). Undecided after
`approval_timeout_s`: `approval_timeout`. A device whose owner requires approvals at the device
(`approvals_local_only`) lists them here, but only `orrery agent approve ID` there decides.

The device's ledger is the one arbiter (its owner may decide there at any moment): an operator's
decision is asked of the device through the engine, and the answer says what actually holds:
200 with the approval once the device confirmed it, 409 with the decision that held if another
came first (the owner's, say), and 202 with the request recorded (`requested_state`) if the
device has not confirmed within `approval_confirm_s` (it is offline, say): it gets the request
when it reconnects, unless a decision is made at the device first.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.api.deps import Comp, Operator, Principal, Viewer
from orchestrator.api.errors import COMMON, ApiError, problems
from orchestrator.api.lookup import check_ref, find_approval
from orchestrator.api.schemas import Page
from orchestrator.engine.records import DecideApproval
from orchestrator.store import approvals as stored
from orchestrator.store.models import Approval

router = APIRouter(prefix="/v1/approvals", tags=["approvals"], responses={**COMMON, **problems(404)})

State = Literal["pending", "approved", "denied", "expired", "cancelled"]


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=2000, description="why; recorded and shown to the node's reader")


class ApprovalOut(BaseModel):
    id: str
    task_id: str
    node_id: str
    device_id: str
    tool: str
    arguments: dict[str, Any]
    reason: str = Field(description="why it needs approval (the tool is on the device's list, or the model's words)")
    state: State
    local_only: bool = Field(description="only the device's owner may decide (`orrery agent approve ID` there)")
    created_at: str
    expires_at: str
    decided_at: str | None = None
    decided_by: str | None = None
    decision_reason: str | None = None
    requested_state: State | None = Field(
        default=None,
        description="a decision asked of the device that it has not confirmed yet (it is applied there unless "
        "a decision was made at the device first)",
    )
    requested_by: str | None = None
    screenshot_url: str | None = Field(
        default=None, description="for a GUI action: the screenshot it was planned on (PNG)"
    )


def approval_out(row: Approval) -> ApprovalOut:
    return ApprovalOut(
        id=row.id,
        task_id=row.task_id,
        node_id=row.node_id,
        device_id=row.device_id,
        tool=row.tool,
        arguments=row.arguments or {},
        reason=row.reason or "",
        state=row.state,
        local_only=bool(row.local_only),
        created_at=row.created_at.isoformat(),
        expires_at=row.expires_at.isoformat(),
        decided_at=row.decided_at.isoformat() if row.decided_at else None,
        decided_by=row.decided_by,
        decision_reason=row.decision_reason,
        requested_state=row.requested_state if row.state == "pending" else None,
        requested_by=row.requested_by if row.state == "pending" else None,
        screenshot_url=f"/v1/approvals/{row.id}/screenshot" if row.screenshot else None,
    )


@router.get("", response_model=Page, responses=problems(400))
async def list_approvals(
    comp: Comp,
    _p: Viewer,
    state: Annotated[State | None, Query(description="only approvals in this state (e.g. pending)")] = None,
    task_id: Annotated[str | None, Query(max_length=200, description="only this task's")] = None,
    order: Annotated[
        Literal["oldest", "newest"], Query(description="oldest first (the order to decide them in) or newest first")
    ] = "oldest",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
) -> Page:
    """Approvals, oldest first by default (the order to decide them in); `next_cursor` pages on."""
    if task_id is not None:
        check_ref("task", task_id)
    rows, nxt = await stored.page(comp.store, state, task_id, limit, cursor, newest_first=order == "newest")
    return Page(items=[approval_out(r) for r in rows], next_cursor=nxt)


async def _find(comp: Comp, approval_id: str) -> Approval:
    """The approval a path names: its id or a unique id prefix (as tasks and devices)."""
    return await find_approval(comp.store, approval_id)


_ONE = problems(409, s409="`ambiguous_id`: the id prefix matches more than one approval (they are named)")


@router.get("/{approval_id}", response_model=ApprovalOut, responses=_ONE)
async def get_approval(approval_id: str, comp: Comp, _p: Viewer) -> ApprovalOut:
    return approval_out(await _find(comp, approval_id))


@router.get(
    "/{approval_id}/screenshot",
    response_class=Response,
    responses={
        **_ONE,
        200: {"content": {"image/png": {}}, "description": "the screenshot the GUI action was planned on"},
    },
)
async def screenshot(approval_id: str, comp: Comp, _p: Viewer) -> Response:
    row = await _find(comp, approval_id)
    if not row.screenshot:
        raise ApiError(404, "not_found", f"approval '{row.id}' has no screenshot (only GUI actions carry one)")
    try:
        png = base64.b64decode(row.screenshot, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(404, "not_found", f"approval '{row.id}' has no readable screenshot") from None
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})


async def _decide(
    comp: Comp, principal: Principal, approval_id: str, state: str, body: Decision | None, response: Response
) -> ApprovalOut:
    row = await _find(comp, approval_id)
    if row.local_only:
        raise ApiError(
            403,
            "approval_local_only",
            f"device {row.device_id}'s owner decides its approvals on the device itself: there, run "
            f"'orrery agent approve {row.id}' or 'orrery agent deny {row.id}'",
        )
    if row.state != "pending":
        raise ApiError(409, "conflict", f"approval '{row.id}' is already {row.state} (by {row.decided_by or '?'})")
    who = f"api key {principal.key_id}" if principal.key_id else f"role {principal.role.value}"
    reply = await comp.cluster.submit(DecideApproval(row.id, state, who, body.reason if body else ""))
    if not reply.get("ok"):
        now = await _find(comp, row.id)
        code = str(reply.get("code") or "conflict")
        if now.state != "pending":
            raise ApiError(409, "conflict", f"approval '{row.id}' is already {now.state} (by {now.decided_by or '?'})")
        raise ApiError(403 if code == "approval_local_only" else 409, code, str(reply.get("detail") or ""))
    # A device known to be away cannot confirm now: say at once that it was asked.
    wait_s = comp.settings.approval_confirm_s if reply.get("online", True) else 0.0
    final = await _confirmed(comp, row.id, wait_s)
    if final.state == state:
        return approval_out(final)
    if final.state != "pending":
        raise ApiError(
            409,
            "conflict",
            f"approval '{row.id}' was {final.state} by {final.decided_by or 'someone'} before your decision "
            f"reached the device; that decision holds ({final.decision_reason or 'no reason given'})",
        )
    response.status_code = 202  # asked of the device; it has not confirmed yet
    return approval_out(final)


async def _confirmed(comp: Comp, approval_id: str, within_s: float) -> Approval:
    """The approval once its device has reported a decision, or as it is after `within_s`."""
    deadline = time.monotonic() + within_s
    delay = 0.01
    while True:
        row = await _find(comp, approval_id)
        if row.state != "pending" or time.monotonic() >= deadline:
            return row
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.25)


_DECIDE = {
    **problems(
        403,
        409,
        422,
        s403="`forbidden` (a viewer) or `approval_local_only`: only the device's owner may",
        s409="`ambiguous_id` (the id prefix matches more than one), or `conflict`: decided already (the "
        "decision that holds is named), its attempt ended, or another decision is on its way to the device",
    ),
    202: {
        "model": ApprovalOut,
        "description": "asked of the device, which has not confirmed within approval_confirm_s (it may be "
        "offline): `requested_state` shows the request; it holds once the device confirms it",
    },
}


@router.post("/{approval_id}/approve", response_model=ApprovalOut, responses=_DECIDE)
async def approve(
    approval_id: str, comp: Comp, principal: Operator, response: Response, body: Decision | None = None
) -> ApprovalOut:
    """Approve: the command runs and its node goes on (200 once the device confirmed it)."""
    return await _decide(comp, principal, approval_id, "approved", body, response)


@router.post("/{approval_id}/deny", response_model=ApprovalOut, responses=_DECIDE)
async def deny(
    approval_id: str, comp: Comp, principal: Operator, response: Response, body: Decision | None = None
) -> ApprovalOut:
    """Deny: the command never runs, and its node fails with `approval_denied` (200 once the
    device confirmed it)."""
    return await _decide(comp, principal, approval_id, "denied", body, response)
