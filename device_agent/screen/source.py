"""Where frames come from and where forwarded input goes: the X11 display or the browser server.

The X11 source captures the root window with mss (as the gui toolset does) and sends input with
xdotool through the gui toolset's own `Gesture` and argv builder, so a person's click and a model's
click are the same XTEST events. The browser source is in `device_agent.screen.browser`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio.to_thread

from device_agent.screen.frames import Frame, Mark, SourceKind, jpeg_from_rgb, marks_in_frame
from device_agent.toolsets.gui.rules import BUTTONS, SCROLL_BUTTONS, Gesture, GuiError, parse_key
from device_agent.toolsets.gui.x11 import InputFailed, X11Backend

InputKind = Literal["click", "double_click", "scroll", "key", "type"]
SCROLL_CLICKS = 3  # wheel steps per forwarded scroll


class SourceFailed(Exception):
    """A frame could not be taken or an input not sent; the message never quotes typed text."""


@dataclass(frozen=True)
class Action:
    """One forwarded input in screen pixels; `keys` already passed the gui toolset's key grammar."""

    kind: InputKind
    x: int = 0
    y: int = 0
    button: Literal["left", "middle", "right"] = "left"
    direction: Literal["up", "down", "left", "right"] = "down"
    keys: str = ""
    text: str = ""


class ScreenSource(Protocol):
    """A screen that can be watched and driven."""

    kind: SourceKind

    async def grab(self, max_side: int, quality: int, marks: bool = False) -> Frame: ...
    async def send(self, action: Action) -> None: ...
    async def close(self) -> None: ...


def no_marks() -> list[Mark]:
    return []


class X11Source:
    """The X display in $DISPLAY (the gui toolset's)."""

    kind: SourceKind = "x11"

    def __init__(self, display: str, marks: Callable[[], list[Mark]] = no_marks) -> None:
        self.display = display
        self._marks = marks
        self._backend = X11Backend(display)

    @classmethod
    def find(cls, marks: Callable[[], list[Mark]] = no_marks) -> X11Source | None:
        """The display in $DISPLAY, or None if there is none (no screen to watch)."""
        display = os.environ.get("DISPLAY", "")
        return cls(display, marks) if display else None

    async def grab(self, max_side: int, quality: int, marks: bool = False) -> Frame:
        return await anyio.to_thread.run_sync(self._grab, max_side, quality, marks)

    def _grab(self, max_side: int, quality: int, marks: bool) -> Frame:
        import mss

        try:
            with mss.MSS(display=self.display) as sct:
                shot = sct.grab(sct.monitors[0])
                rgb, sw, sh = shot.rgb, shot.width, shot.height
        except Exception as exc:  # mss raises ScreenShotError, ctypes errors, OSError...
            raise SourceFailed(f"cannot capture X display {self.display!r}: {exc}") from exc
        image, w, h = jpeg_from_rgb(rgb, sw, sh, max_side, quality)
        boxes = tuple(marks_in_frame(self._marks(), (w, h), (sw, sh))) if marks else ()
        return Frame(image, w, h, sw, sh, "x11", marks=boxes)

    async def send(self, action: Action) -> None:
        try:
            await self._backend.send(gesture(action))
        except (InputFailed, GuiError) as exc:
            message = exc.message if isinstance(exc, GuiError) else str(exc)
            raise SourceFailed(message) from None

    async def close(self) -> None:
        return None


def gesture(action: Action) -> Gesture:
    """The gui toolset's gesture for a forwarded input (screen pixels)."""
    point = ((action.x, action.y),)
    if action.kind in ("click", "double_click"):
        count = 2 if action.kind == "double_click" else 1
        return Gesture("click", point, button=BUTTONS[action.button], count=count)
    if action.kind == "scroll":
        return Gesture("scroll", point, button=SCROLL_BUTTONS[action.direction], count=SCROLL_CLICKS)
    if action.kind == "key":
        return Gesture("key", keys=parse_key(action.keys))
    return Gesture("type", text=action.text)


def ffmpeg_path() -> str | None:
    """Debian's ffmpeg, if installed (recordings need it)."""
    return shutil.which("ffmpeg")
