"""The `gui` MCP server: observe the screen, then act on what was observed (SPEC section 5).

Tools (namespaced `gui.*` by the router):
- `observe` -> a PNG screenshot (image content) and `{observation_id, width, height,
  focused_window: {id, title}, ...}`; read-only.
- `click`, `double_click`, `type`, `set_value`, `key`, `scroll`, `drag` -> one input each. Each
  needs the current `observation_id` and a caller-chosen `action_id`; each answers with a receipt
  holding the next observation (and its screenshots). Not idempotent: never retried blindly.
  `click`, `double_click`, `type` and `set_value` take an `element_id` (with its `name`) from the
  observation's accessibility tree instead of coordinates (see `grounding`, `atspi`).
- `windows` (read-only), `focus_window`, `launch` (an argv under the shell policy, see `windows`).
- `wait` -> waits, then observes; no input. Read-only, but bound to an observation like input.
- `stop` -> the stop latch: input is refused (`stopped`) until an operator resumes the device
  (`POST /v1/devices/{id}/resume`, which reaches the agent as `device_resume`). There is no
  `resume` tool: a model must not be able to lift a stop, its own or an operator's. An operator's
  emergency stop (`device_stop`) engages the same latch (through `ctx.stop_latch`).

Error codes: `stale_observation`, `id_conflict`, `busy`, `stopped`, `invalid_arguments`,
`tool_error`, `uncertain`, `action_limit`, `element_mismatch`, `element_not_actionable` (and
`policy_denied` under the kill switch, or for a program the shell policy refuses).
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ImageContent, ToolAnnotations
from pydantic import Field
from typing_extensions import TypedDict

from device_agent.datadir import SCREENSHOTS_NAME
from device_agent.policy import PolicyDenied, check_action
from device_agent.toolsets.base import READ_ONLY, Toolkit, ToolsetContext, action, failure, success, tool
from device_agent.toolsets.gui.control import SETTLE_S, Controller, Observation
from device_agent.toolsets.gui.display import DisplayLock
from device_agent.toolsets.gui.grounding import Accessibility, AtspiAccessibility, ElementAct
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
from device_agent.toolsets.gui.windows import launch as launch_argv
from device_agent.toolsets.gui.windows import windows as list_windows
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
OptX = Annotated[
    int | None, Field(ge=0, description="pixels from the left edge of the screenshot (when no element_id is given)")
]
OptY = Annotated[
    int | None, Field(ge=0, description="pixels from the top edge of the screenshot (when no element_id is given)")
]
ElementId = Annotated[
    int | None,
    Field(
        ge=1,
        description="id of an element in the observation's accessibility.elements (the number marked on the "
        "marked screenshot); valid only for that observation. Preferred over x, y when the element is listed",
    ),
]
ElementName = Annotated[
    str | None,
    Field(
        description="the element's name as listed in the observation: required with element_id, refused if it differs"
    ),
]
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
    accessibility: NotRequired[dict[str, Any]]
    marked_screenshot: NotRequired[bool]


class InputReceipt(TypedDict):
    action_id: str
    tool: str
    status: str
    input_dispatched: bool
    outcome_verified: bool
    retry_safe: bool
    replayed: bool
    observation: ObservationResult | None
    element_id: NotRequired[int]
    route: NotRequired[str]
    verification: NotRequired[str]


class WindowList(TypedDict):
    windows: list[dict[str, Any]]


class FocusResult(TypedDict):
    window_id: int
    title: str
    focused: bool


class LaunchResult(TypedDict):
    pid: int
    program: str


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
    accessibility: Accessibility | None = None,
) -> MCPServer:
    """The `gui` MCP server for the X display in $DISPLAY (or `backend`, for tests)."""
    if backend is None:
        backend = X11Backend(os.environ.get("DISPLAY", ""), ctx.processes, lambda: ctx.policy)
    store = ScreenshotStore(ctx.data_dir / SCREENSHOTS_NAME if ctx.data_dir else None)
    lock = DisplayLock(backend.display, lock_dir)
    controller = Controller(backend, store, lock, clock, settle_s, accessibility or AtspiAccessibility())
    # The device-level stop engages the latch (interrupting input, releasing held buttons and
    # modifiers); only the device-level resume lifts it.
    ctx.stop_latch.on(controller.stop, controller.resume)
    ctx.takeover.on_change(controller.invalidate)  # a person had the screen: the model observes afresh

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[None]:
        try:
            yield
        finally:  # the agent is shutting the toolset down: give the display up
            controller.close()

    kit = Toolkit("gui")

    async def act(
        name: str, arguments: dict[str, Any], gesture_for: Callable[[Observation], Gesture | ElementAct | None]
    ) -> CallToolResult:
        try:
            if not backend.display:
                raise GuiError("tool_error", "DISPLAY is not set for this agent: there is no X11 screen to drive")
            if gesture_for is not _wait:
                check_action(ctx.policy, tool_is_read_only=False)
            check_action_id(arguments["action_id"])
            outcome, images = await controller.act(name, arguments, gesture_for)
        except PolicyDenied as exc:
            return failure(exc.code, str(exc))
        except GuiError as exc:
            return failure(exc.code, exc.message, **exc.details)
        return _result(outcome, images)

    @tool(kit, READ_ONLY)
    async def observe() -> Annotated[CallToolResult, ObservationResult]:
        """Take a screenshot of the device's screen: the first step before any input.

        Returns the PNG and an observation_id valid for 60 s and for one input. Coordinates of
        inputs are pixels of this image (x from the left, y from the top). focused_window is the
        window that receives typing; inputs are refused if it changes before they run.

        accessibility.elements lists the focused application's controls (AT-SPI): id, role, name,
        states, bounds (screen pixels). When there are any, a second image shows each one boxed
        with its id: act on it with element_id (and its name) instead of coordinates.
        """
        try:
            if not backend.display:
                raise GuiError("tool_error", "DISPLAY is not set for this agent: there is no X11 screen to drive")
            data, images = await controller.observe()
        except GuiError as exc:
            return failure(exc.code, exc.message, **exc.details)
        return _result(Outcome(True, data), images)

    @tool(kit, INPUT)
    async def click(
        observation_id: ObservationId,
        action_id: ActionId,
        x: OptX = None,
        y: OptY = None,
        button: Button = "left",
        element_id: ElementId = None,
        name: ElementName = None,
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Click an element (element_id, with its name) or a point (x, y) of the observation's screenshot.

        An element is clicked through its accessibility action when it has one, else by pointer at
        its centre; it must be enabled and visible. The receipt says how and what was verified.
        """
        args = {"observation_id": observation_id, "action_id": action_id, "x": x, "y": y, "button": button}
        args |= {"element_id": element_id, "name": name}
        return await act("click", args, _target("click", x, y, element_id, name, button=BUTTONS[button]))

    @tool(kit, INPUT)
    async def double_click(
        observation_id: ObservationId,
        action_id: ActionId,
        x: OptX = None,
        y: OptY = None,
        element_id: ElementId = None,
        name: ElementName = None,
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Double-click the left button on an element (element_id, with its name) or at (x, y)."""
        args = {"observation_id": observation_id, "action_id": action_id, "x": x, "y": y}
        args |= {"element_id": element_id, "name": name}
        return await act("double_click", args, _target("double_click", x, y, element_id, name, count=2))

    @tool(kit, INPUT, name="type")
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
        element_id: ElementId = None,
        name: ElementName = None,
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Type text literally (nothing in it is a command or a shortcut) into an element or the focused window.

        With element_id (and its name) the text goes into that field (inserted at its caret through
        its editable text, or typed after a click on it). Without, click the target field first so
        it has the keyboard focus. For shortcuts use gui.key.
        """
        try:
            check_text(text)
        except GuiError as exc:
            return failure(exc.code, exc.message)
        args: dict[str, Any] = {"observation_id": observation_id, "action_id": action_id, "text": text}
        if element_id is None:
            if name is not None:
                return failure("invalid_arguments", "name is the cross-check of an element_id: pass both, or neither")
            return await act("type", args, lambda _: Gesture("type", text=text))
        if name is None:
            return failure("invalid_arguments", NAME_REQUIRED)
        args |= {"element_id": element_id, "name": name}
        return await act("type", args, lambda o: ElementAct("type", o.element(element_id, name), text=text))

    @tool(kit, INPUT)
    async def set_value(
        observation_id: ObservationId,
        action_id: ActionId,
        element_id: Annotated[int, Field(ge=1, description="the element's id in the observation")],
        name: Annotated[str, Field(description="the element's name as listed: refused if it differs")],
        value: Annotated[
            str | float,
            Field(description="a number for a slider or spin button; the whole new text for a text field"),
        ],
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Set an element's value: a slider's number or a text field's whole text (it replaces what is there).

        The element must be enabled and visible; the receipt says whether the new value was read back.
        """
        args: dict[str, Any] = {"observation_id": observation_id, "action_id": action_id}
        args |= {"element_id": element_id, "name": name, "value": value}
        if isinstance(value, str) and len(value) > 2000:
            return failure("invalid_arguments", f"value has {len(value)} characters, more than the 2000 allowed")
        return await act("set_value", args, lambda o: ElementAct("set_value", o.element(element_id, name), value=value))

    @tool(kit, INPUT)
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

    @tool(kit, INPUT)
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

    @tool(kit, INPUT)
    async def drag(
        observation_id: ObservationId, action_id: ActionId, x: X, y: Y, to_x: X, to_y: Y
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Press the left button at (x, y), move to (to_x, to_y) and release it there."""
        args = {"observation_id": observation_id, "action_id": action_id, "x": x, "y": y, "to_x": to_x, "to_y": to_y}
        return await act("drag", args, lambda o: Gesture("drag", (o.point(x, y), o.point(to_x, to_y, "to_x, to_y"))))

    @tool(kit, READ_ONLY)
    async def wait(
        observation_id: ObservationId,
        action_id: ActionId,
        ms: Annotated[int, Field(ge=200, le=3000, description="milliseconds to wait, 200-3000")] = 1000,
    ) -> Annotated[CallToolResult, InputReceipt]:
        """Wait for the screen to settle (a page loading, an animation), then observe again. No input."""
        args = {"observation_id": observation_id, "action_id": action_id, "ms": ms}
        return await act("wait", args, _wait)

    @tool(kit, READ_ONLY)
    async def windows() -> Annotated[CallToolResult, WindowList]:
        """List the top-level windows on the screen: id, title, pid, bounds and which one is focused."""
        try:
            if not backend.display:
                raise GuiError("tool_error", "DISPLAY is not set for this agent: there is no X11 screen to drive")
            return success({"windows": await list_windows(backend.display)})
        except GuiError as exc:
            return failure(exc.code, exc.message)

    @tool(kit, INPUT)
    async def focus_window(
        window_id: Annotated[int, Field(ge=1, description="a window id from gui.windows")],
    ) -> Annotated[CallToolResult, FocusResult]:
        """Raise a window and give it the keyboard focus. The current observation is voided: observe again."""
        try:
            check_action(ctx.policy, tool_is_read_only=False)
            if not backend.display:
                raise GuiError("tool_error", "DISPLAY is not set for this agent: there is no X11 screen to drive")
            listed = await list_windows(backend.display)
            target = next((w for w in listed if w["id"] == window_id), None)
            if target is None:
                raise GuiError(
                    "invalid_arguments",
                    f"no window with id {window_id} is on the screen; call gui.windows for the current ids",
                )
            await controller.focus(window_id)
            now = await list_windows(backend.display)
            focused = any(w["id"] == window_id and w["focused"] for w in now)
        except PolicyDenied as exc:
            return failure(exc.code, str(exc))
        except GuiError as exc:
            return failure(exc.code, exc.message, **exc.details)
        return success({"window_id": window_id, "title": target["title"], "focused": focused})

    @tool(kit, INPUT)
    async def launch(
        argv: Annotated[
            list[str],
            Field(description="the program and its arguments, e.g. ['gedit', 'notes.txt']; never a shell string"),
        ],
    ) -> Annotated[CallToolResult, LaunchResult]:
        """Start an application on this screen (the device's shell policy decides which programs may run).

        It runs detached; call gui.windows or gui.observe to see its window appear.
        """
        try:
            check_action(ctx.policy, tool_is_read_only=False)
            if not backend.display:
                raise GuiError("tool_error", "DISPLAY is not set for this agent: there is no X11 screen to drive")
            controller.ensure_running()
            pid = await launch_argv(argv, backend.display, ctx.policy)
        except PolicyDenied as exc:
            return failure(exc.code, str(exc))
        except GuiError as exc:
            return failure(exc.code, exc.message)
        controller.invalidate()
        return success({"pid": pid, "program": argv[0]})

    @tool(kit, CONTROL)
    async def stop() -> Annotated[CallToolResult, StopResult]:
        """Stop all input on this device now: an input in flight is interrupted, held keys released.

        Later inputs fail with 'stopped' until an operator resumes the device (no tool can lift
        the stop); after that, call gui.observe for a new observation.
        """
        return success(await controller.stop())

    return kit.server(lifespan=lifespan)


def _wait(_: Observation) -> Gesture | None:
    """The 'gesture' of gui.wait: none (the controller waits instead)."""
    return None


NAME_REQUIRED = (
    "element_id needs the element's name too (as listed in the observation): it is checked, so that a "
    "wrong or misread id cannot act on another element"
)


def _target(
    tool: str,
    x: int | None,
    y: int | None,
    element_id: int | None,
    name: str | None,
    *,
    button: int = 1,
    count: int = 1,
) -> Callable[[Observation], Gesture | ElementAct]:
    """The gesture for a point, or the element input for an element_id: exactly one of the two."""
    if element_id is not None and (x is not None or y is not None):
        raise_later = GuiError("invalid_arguments", "give either element_id (with name) or x and y, not both")
    elif element_id is None and (x is None or y is None):
        raise_later = GuiError(
            "invalid_arguments", "give an element_id (with its name) from the observation, or both x and y"
        )
    elif element_id is not None and name is None:
        raise_later = GuiError("invalid_arguments", NAME_REQUIRED)
    elif element_id is None and name is not None:
        raise_later = GuiError("invalid_arguments", "name is the cross-check of an element_id: pass both, or neither")
    else:
        raise_later = None

    def resolve(o: Observation) -> Gesture | ElementAct:
        if raise_later is not None:
            raise raise_later
        if element_id is not None:
            return ElementAct(tool, o.element(element_id, name), button=button)
        assert x is not None and y is not None
        return Gesture("click", (o.point(x, y),), button, count=count)

    return resolve


def _result(outcome: Outcome, images: list[bytes]) -> CallToolResult:
    """A receipt or observation as structured content, with the screenshots first (plain, then marked)."""
    if not outcome.ok:
        return failure(outcome.code, outcome.message, **outcome.data)
    result = success(outcome.data)
    for png in reversed(images):
        image = ImageContent(type="image", data=base64.b64encode(png).decode("ascii"), mime_type="image/png")
        result.content.insert(0, image)
    return result
