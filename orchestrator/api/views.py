"""Live views of a device's screen and input through them: `/v1/devices/{device_id}/views`,
`/v1/devices/{device_id}/views/{view_id}/frames` and `/v1/devices/{device_id}/input`.

Watching is reading (viewer role); input is an action (operator role). Whether the device is
taken over is the device's to judge: its agent refuses input otherwise (`not_taken_over`), and
this API forwards, waits for its answer and says what it was.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Annotated
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Body, Path, Query
from fastapi.responses import StreamingResponse

from orchestrator.api.deps import Comp, Operator, Viewer
from orchestrator.api.errors import COMMON, ApiError, problems
from orchestrator.api.lookup import find_device
from orchestrator.api.view_schemas import ViewCreate, ViewInputIn, ViewInputOut, ViewOut
from orchestrator.domain.model import AdminState, Liveness
from orchestrator.ids import new_id
from orchestrator.store.models import Device
from orchestrator.views.hub import ViewOptions
from orchestrator.views.tickets import TicketCheck, Tickets
from protocol.messages import FEATURE_VIEW, ViewInput

router = APIRouter(prefix="/v1/devices", tags=["views"], responses={**COMMON, **problems(404)})

VIEW_TTL_S = 3600.0  # a view id opens its frames (again) for this long
INPUT_WAIT_S = 10.0  # how long an input waits for the device's answer
KEEPALIVE_S = 15.0
KEY_CHECK_S = 5.0  # an open stream looks up its API key this often (a revoked key ends it)
_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

_OPEN_409 = (
    "`device_offline`: the device is not connected; `view_unsupported`: its agent did not announce "
    "live views (`view`) in its hello (an older agent, or one without a screen)"
)
_FRAMES = (
    "Server-Sent Events: `frame` (data: n, mime, image_b64, width, height, screen_width, screen_height, "
    "source, marks [{id, name, x, y, w, h} in the frame's pixels], at) as the device sends them; a slow "
    "reader skips frames rather than falling behind. `ended` (data: code, message) ends the stream: "
    "the device refused (`watch_disallowed`: its owner's policy; `no_screen`), stopped (`lease_expired`, "
    "`ended`, `error`), went offline (`device_offline`), or this key was revoked (`key_revoked`). "
    "A line starting with `:` is a keep-alive. Leaving ends this viewer; the device stops streaming "
    "when its last viewer leaves."
)
_INPUT_409 = (
    "the device refused the input, with its own code: `not_taken_over` (take the device over first), "
    "`input_disallowed` (its owner's policy), `device_stopped`, ...; or `device_offline`, `view_unsupported`"
)


@router.post(
    "/{device_id}/views",
    status_code=201,
    response_model=ViewOut,
    responses=problems(s409=_OPEN_409),
)
async def open_view(device_id: str, comp: Comp, principal: Viewer, body: ViewCreate | None = None) -> ViewOut:
    """A live view of the device's screen for this API key. Read its frames from `frames_url`
    with the same key; the device streams only while someone reads."""
    row = await _watchable(comp, device_id)
    want = body or ViewCreate()
    ticket = Tickets(comp.hasher, VIEW_TTL_S).issue(row.id, principal.key_id, time.time())
    return ViewOut(
        view_id=ticket.view_id,
        device_id=row.id,
        expires_at=ticket.expires_at,
        frames_url=f"/v1/devices/{row.id}/views/{ticket.view_id}/frames?"
        + urlencode(
            {
                "fps": f"{want.fps:g}",
                "max_side": want.max_side,
                "quality": want.quality,
                "marks": str(want.marks).lower(),
            }
        ),
        fps=want.fps,
        max_side=want.max_side,
        quality=want.quality,
        marks=want.marks,
    )


@router.get(
    "/{device_id}/views/{view_id}/frames",
    response_class=StreamingResponse,
    responses={
        200: {"description": _FRAMES, "content": {"text/event-stream": {"schema": {"type": "string"}}}},
        **problems(
            s403="`view_scope`: the view id is not one of this device's views made with this API key",
            s409=_OPEN_409,
            s410="`view_expired`: the view id is past its `expires_at`; open a new view",
        ),
    },
)
async def frames(
    device_id: str,
    view_id: Annotated[str, Path(max_length=200)],
    comp: Comp,
    principal: Viewer,
    fps: Annotated[float, Query(gt=0, le=15)] = 2.0,
    max_side: Annotated[int, Query(ge=64, le=4096)] = 1280,
    quality: Annotated[int, Query(ge=10, le=95)] = 70,
    marks: bool = False,
) -> StreamingResponse:
    """The view's frames, live (see the 200 answer for the events)."""
    row = await find_device(comp.store, device_id)
    check = Tickets(comp.hasher, VIEW_TTL_S).check(view_id, row.id, principal.key_id, time.time())
    if check is TicketCheck.SCOPE:
        raise ApiError(403, check.value, "this view id is not one of this device's views made with this API key")
    if check is TicketCheck.EXPIRED:
        raise ApiError(410, check.value, "this view has expired; open a new one (POST .../views)")
    await _watchable(comp, row.id)
    return StreamingResponse(
        _stream(comp, row.id, ViewOptions(fps, max_side, quality, marks), principal.key_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/{device_id}/input",
    response_model=ViewInputOut,
    responses=problems(
        s409=_INPUT_409,
        s504="`device_no_answer`: the device did not answer in time; the input may or may not have been applied",
    ),
)
async def send_input(
    device_id: str, comp: Comp, principal: Operator, body: Annotated[ViewInputIn, Body()]
) -> ViewInputOut:
    """Forward a pointer or key input to the device the caller has taken over, and wait (up to
    ten seconds) for the device to apply or refuse it. Another operator's takeover: 409
    `conflict` (only the one who has the device sends it input)."""
    row = await _watchable(comp, device_id)
    by = principal.operator  # as the takeover names its holder
    holder = (row.control or {}).get("taken_over_by")
    if holder and holder != by:
        # One person at a time: only the operator who took the device over drives it.
        raise ApiError(409, "conflict", f"device '{row.name}' is taken over by {holder}: only they send it input")
    frame = ViewInput(input_id=new_id("in"), by=by, **body.model_dump())
    answer = await comp.views.send_input(row.id, frame, INPUT_WAIT_S)
    if answer is None:
        raise ApiError(
            504,
            "device_no_answer",
            f"device '{row.name}' did not answer within {INPUT_WAIT_S:g}s: the input may or may not have "
            "been applied; look at the live view before sending it again",
        )
    if not answer.get("ok"):
        code = str(answer.get("code") or "")
        raise ApiError(
            409,
            code if _CODE.match(code) else "input_refused",
            str(answer.get("message") or "the device refused the input")[:2000],
        )
    return ViewInputOut(ok=True, input_id=frame.input_id)


async def _online(comp: Comp, device_id: str, row: Device | None = None) -> bool:
    row = row or await comp.store.get_device(device_id)
    if row is None or row.admin_state == AdminState.REVOKED:
        return False
    return comp.gateway.is_connected(row.id) or row.liveness not in (Liveness.OFFLINE, Liveness.ENROLLED)


async def _watchable(comp: Comp, device_id: str) -> Device:
    row = await find_device(comp.store, device_id)
    if not await _online(comp, row.id, row):
        raise ApiError(409, "device_offline", f"device '{row.name}' is not connected; its screen cannot be reached")
    announced = (row.info or {}).get("features")  # the engine stores the hello's features there
    stored = isinstance(announced, list) and FEATURE_VIEW in announced
    if not stored and not await comp.views.supports(row.id):  # else a hello heard here, not stored yet
        raise ApiError(
            409,
            "view_unsupported",
            f"device '{row.name}' did not announce live views: its agent is older, or has no screen to show",
        )
    return row


async def _stream(comp: Comp, device_id: str, options: ViewOptions, key_id: str) -> AsyncIterator[str]:
    """The viewer's events until the stream ends or the client leaves (Starlette then cancels
    this generator, which detaches the viewer: the last one stops the device's stream)."""
    key_checked = time.monotonic()
    async with comp.views.watch(device_id, options) as viewer:
        yield ": watching\n\n"
        while True:
            event = await viewer.next(KEEPALIVE_S)
            if time.monotonic() - key_checked >= KEY_CHECK_S:
                if not await comp.store.api_key_active(key_id):
                    yield _sse("ended", {"code": "key_revoked", "message": "the API key of this view was revoked"})
                    return
                if not await _online(comp, device_id):
                    # The store is the truth: a device whose replica died without a word is offline there.
                    yield _sse("ended", {"code": "device_offline", "message": "the device went offline"})
                    return
                key_checked = time.monotonic()
            if event is None:
                yield ": keep-alive\n\n"
                continue
            kind = str(event.get("kind"))
            data = {k: v for k, v in event.items() if k not in ("kind", "stream_id")}
            yield _sse(kind, data)
            if kind == "ended":
                return


def _sse(kind: str, data: dict[str, object]) -> str:
    return f"event: {kind}\ndata: {orjson.dumps(data).decode()}\n\n"
