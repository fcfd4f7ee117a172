"""The `gui` MCP server: observe the screen, then act on what was observed (SPEC section 5).

Tools (namespaced `gui.*` by the router):
- `observe` -> a PNG screenshot (image content) and `{observation_id, width, height,
  focused_window: {id, title}, ...}`; read-only.
- `click`, `double_click`, `type`, `key`, `scroll`, `drag` -> one input each. Each needs the
  current `observation_id` and a caller-chosen `action_id`; each answers with a receipt holding
  the next observation (and its screenshot). Not idempotent: never retried blindly.
- `wait` -> waits, then observes; no input. Read-only, but bound to an observation like input.
- `stop` -> the stop latch: input is refused (`stopped`) until an operator resumes the device
  (`POST /v1/devices/{id}/resume`, which reaches the agent as `device_resume`). There is no
  `resume` tool: a model must not be able to lift a stop, its own or an operator's. An operator's
  emergency stop (`device_stop`) engages the same latch (through `ctx.stop_latch`).

Error codes: `stale_observation`, `id_conflict`, `busy`, `stopped`, `invalid_arguments`,
`tool_error`, `uncertain`, `action_limit` (and `policy_denied` under the kill switch).
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ImageContent, ToolAnnotations
from pydantic import Field
from typing_extensions import TypedDict

from device_agent.datadir import SCREENSHOTS_NAME
from device_agent.policy import PolicyDenied, check_action
from device_agent.toolsets.base import READ_ONLY, ToolsetContext, action, failure, success, tool
from device_agent.toolsets.gui.control import SETTLE_S, Controller, Observation
from device_agent.toolsets.gui.display import DisplayLock
from device_agent.toolsets.gui.receipts import Outcome
from device_agent.toolsets.gui.rules import (
    BUTTONS,
    SCROLL_BUTTONS,
    Gesture,
    GuiError,
    check_action_id,
    check_text,
    parse_key,
)
from device_agent.toolsets.gui.screens import ScreenshotStore
from device_agent.toolsets.gui.x11 import Backend, X11Backend

CONTROL = ToolAnnotations(read_only_hint=False, idempotent_hint=True, destructive_hint=False, open_world_hint=False)
INPUT = action(idempotent=False, destructive=True)

ObservationId = Annotated[
    str, Field(description="observation_id of the latest gui.observe, or of the observation the last input returned")
]
ActionId = Annotated[
    str,
    Field(
        description="a new unique id for this action (8-128 characters, e.g. a UUID); retrying with the same id "
        "and the same arguments returns the original receipt without acting again"
    ),
]
X = Annotated[int, Field(ge=0, description="pixels from the left edge of the observation's screenshot")]
Y = Annotated[int, Field(ge=0, description="pixels from the top edge of the observation's screenshot")]
Button = Literal["left", "middle", "right"]


class FocusedWindow(TypedDict):
    id: int | None
    title: str


class ObservationResult(TypedDict):
    observation_id: str
    width: int
    height: int
    coordinate_space: str
    screen_width: int
    screen_height: int
    focused_window: FocusedWindow
    expires_in_s: float
    screenshot_path: str
    screenshot_sha256: str


class InputReceipt(TypedDict):
    action_id: str
    tool: str
    status: str
    input_dispatched: bool
    outcome_verified: bool
    retry_safe: bool
    replayed: bool
    observation: ObservationResult | None


class StopResult(TypedDict):
    stopped: bool
    interrupted_input: bool
    released: bool


def build(
    ctx: ToolsetContext,
    *,
    backend: Backend | None = None,
    clock: Callable[[], float] = time.monotonic,
    lock_dir: Path | None = None,
    settle_s: float = SETTLE_S,
) -> MCPServer:
    """The `gui` MCP server for the X display in $DISPLAY (or `backend`, for tests)."""
    if backend is None:
        backend = X11Backend(os.environ.get("DISPLAY", ""), ctx.processes, lambda: ctx.policy)
    store = ScreenshotStore(ctx.data_dir / SCREENSHOTS_NAME if ctx.data_dir else None)
    controller = Controller(backend, store, DisplayLock(backend.display, lock_dir), clock, settle_s)
    # The device-level stop engages the latch (interrupting input, releasing held buttons and
    # modifiers); only the device-level resume lifts it.
    ctx.stop_latch.on(controller.stop, controller.resume)

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[None]:
        try:
            yield
        finally:  # the agent is shutting the toolset down: give the display up
            controller.close()

    server = MCPServer("gui", lifespan=lifespan)

    async def act(
        name: str, arguments: dict[str, Any], gesture_for: Callable[[Observation], Gesture | None]
    ) -> CallToolResult:
        try:
            if not backend.display:
                raise GuiError("tool_error", "DISPLAY is not set for this agent: there is no X11 screen to drive")
            if gesture_for is not _wait:
                check_action(ctx.policy, tool_is_read_only=False)
            check_action_id(arguments["action_id"])
            outcome, png = await controller.act(name, arguments, gesture_for)
        except PolicyDenied as exc:
            return failure(exc.code, str(exc))
        except GuiError as exc:
            return failure(exc.code, exc.message, **exc.details)
        return _result(outcome, png)

    @tool(server, READ_ONLY)
    async def observe() -> Annotated[CallToolResult, ObservationResult]:
        """Take a screenshot of the device's screen: the first step before any input.

        Returns the PNG and an observation_id valid for 60 s and for one input. Coordinates of
        inputs are pixels of this image (x from the left, y from the top). focused_window is the
        window that receives typing; inputs are refused if it changes before they run.
        """
        try:
            if not backend.display:
                raise GuiError("tool_error", "DISPLAY is not set for this agent: there is no X11 screen to drive")
            data, png = await controller.observe()
        except GuiError as exc:
            return failure(exc.code, exc.message, **exc.details)
        return _result(Outcome(True, data), png)

    @tool(server, INPUT)
    async def click(
        observation_id: ObservationId, action_id: ActionId, x: X, y: Y, button: Button = "left"
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Click a mouse button once at (x, y) of the observation's screenshot."""
        args = {"observation_id": observation_id, "action_id": action_id, "x": x, "y": y, "button": button}
        return await act("click", args, lambda o: Gesture("click", (o.point(x, y),), BUTTONS[button]))

    @tool(server, INPUT)
    async def double_click(
        observation_id: ObservationId, action_id: ActionId, x: X, y: Y
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Double-click the left mouse button at (x, y) of the observation's screenshot."""
        args = {"observation_id": observation_id, "action_id": action_id, "x": x, "y": y}
        return await act("double_click", args, lambda o: Gesture("click", (o.point(x, y),), 1, count=2))

    @tool(server, INPUT, name="type")
    async def type_text(
        observation_id: ObservationId,
        action_id: ActionId,
        text: Annotated[
            str,
            Field(
                description="characters to type, 1-2000, no control characters except newline (Enter) and tab",
                json_schema_extra={"minLength": 1, "maxLength": 2000},
            ),
        ],
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Type text into the focused window, literally (nothing in it is a command or a shortcut).

        Click the target field first so it has the keyboard focus. For shortcuts use gui.key.
        """
        try:
            check_text(text)
        except GuiError as exc:
            return failure(exc.code, exc.message)
        args = {"observation_id": observation_id, "action_id": action_id, "text": text}
        return await act("type", args, lambda _: Gesture("type", text=text))

    @tool(server, INPUT)
    async def key(
        observation_id: ObservationId,
        action_id: ActionId,
        key: Annotated[str, Field(description="e.g. 'ctrl+s', 'enter', 'alt+f4', 'ctrl+shift+t', 'pagedown'")],
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Press a key or a key combination in the focused window.

        Grammar: up to 4 distinct modifiers (ctrl, alt, shift, super) and one final key joined by
        '+'. Final keys: a-z, 0-9, f1-f12, enter, tab, escape, space, backspace, delete, insert,
        home, end, pageup, pagedown, up, down, left, right, minus, equal, comma, period, slash.
        """
        try:
            keys = parse_key(key)
        except GuiError as exc:
            return failure(exc.code, exc.message)
        args = {"observation_id": observation_id, "action_id": action_id, "key": key}
        return await act("key", args, lambda _: Gesture("key", keys=keys))

    @tool(server, INPUT)
    async def scroll(
        observation_id: ObservationId,
        action_id: ActionId,
        x: X,
        y: Y,
        direction: Literal["up", "down", "left", "right"],
        amount: Annotated[int, Field(ge=1, le=10, description="wheel steps, 1-10")] = 3,
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Scroll with the mouse wheel over (x, y) of the observation's screenshot."""
        args = {"observation_id": observation_id, "action_id": action_id, "x": x, "y": y}
        args |= {"direction": direction, "amount": amount}
        return await act(
            "scroll", args, lambda o: Gesture("scroll", (o.point(x, y),), SCROLL_BUTTONS[direction], count=amount)
        )

    @tool(server, INPUT)
    async def drag(
        observation_id: ObservationId, action_id: ActionId, x: X, y: Y, to_x: X, to_y: Y
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Press the left button at (x, y), move to (to_x, to_y) and release it there."""
        args = {"observation_id": observation_id, "action_id": action_id, "x": x, "y": y, "to_x": to_x, "to_y": to_y}
        return await act("drag", args, lambda o: Gesture("drag", (o.point(x, y), o.point(to_x, to_y, "to_x, to_y"))))

    @tool(server, READ_ONLY)
    async def wait(
        observation_id: ObservationId,
        action_id: ActionId,
        ms: Annotated[int, Field(ge=200, le=3000, description="milliseconds to wait, 200-3000")] = 1000,
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Wait for the screen to settle (a page loading, an animation), then observe again. No input."""
        args = {"observation_id": observation_id, "action_id": action_id, "ms": ms}
        return await act("wait", args, _wait)

    @tool(server, CONTROL)
    async def stop() -> Annotated[CallToolResult, StopResult]:
        """Stop all input on this device now: an input in flight is interrupted, held keys released.

        Later inputs fail with 'stopped' until an operator resumes the device (no tool can lift
        the stop); after that, call gui.observe for a new observation.
        """
        return success(await controller.stop())

    return server


def _wait(_: Observation) -> Gesture | None:
    """The 'gesture' of gui.wait: none (the controller waits instead)."""
    return None


def _result(outcome: Outcome, png: bytes | None) -> CallToolResult:
    """A receipt or observation as structured content, with the screenshot first when there is one."""
    if not outcome.ok:
        return failure(outcome.code, outcome.message, **outcome.data)
    result = success(outcome.data)
    if png is not None:
        image = ImageContent(type="image", data=base64.b64encode(png).decode("ascii"), mime_type="image/png")
        result.content.insert(0, image)
    return result
