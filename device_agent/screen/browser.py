"""The browser profile's page as a screen: frames and input through the agent's own MCP session.

No new port and no second client: frames are `browser_take_screenshot` (JPEG, the viewport at
CSS scale, so the frame's pixels are the page's coordinates) and input is the coordinate mouse
tools of Playwright's `--caps vision` plus `browser_press_key`, all called on the `browser`
toolset's existing session. The profile starts the server with `--caps vision` and keeps those
tools out of the catalogue (`BROWSER_VIEW_TOOLS`), so tasks never see them. Each screenshot is
written to one file in the browser's output directory, overwritten every frame (Playwright
always writes one), so watching never fills the disk.
"""

from __future__ import annotations

import base64
from pathlib import Path

import anyio.to_thread
from mcp.types import CallToolResult, ImageContent

from device_agent.router import Router
from device_agent.screen.frames import Frame, SourceKind, rescale_jpeg, size_of
from device_agent.screen.source import Action, SourceFailed
from device_agent.toolset_host import ToolsetUnavailable

NAMESPACE = "browser"
CALL_TIMEOUT_S = 15.0
FRAME_FILE = "live-view.jpeg"
WHEEL_PX = 300  # one forwarded scroll
WHEEL = {"up": (0, -WHEEL_PX), "down": (0, WHEEL_PX), "left": (-WHEEL_PX, 0), "right": (WHEEL_PX, 0)}
# The gui toolset's key names (rules.FINAL_KEYS, lower case) in Playwright's spelling.
KEYS = {
    "enter": "Enter",
    "return": "Enter",
    "tab": "Tab",
    "escape": "Escape",
    "esc": "Escape",
    "space": " ",
    "backspace": "Backspace",
    "delete": "Delete",
    "insert": "Insert",
    "home": "Home",
    "end": "End",
    "pageup": "PageUp",
    "page_up": "PageUp",
    "pagedown": "PageDown",
    "page_down": "PageDown",
    "up": "ArrowUp",
    "down": "ArrowDown",
    "left": "ArrowLeft",
    "right": "ArrowRight",
    "minus": "-",
    "equal": "=",
    "comma": ",",
    "period": ".",
    "slash": "/",
}
MODIFIERS = {"ctrl": "Control", "control": "Control", "alt": "Alt", "shift": "Shift", "super": "Meta"}
TYPED = {"\n": "Enter", "\t": "Tab"}


def playwright_key(keys: str) -> str:
    """A key combination that passed `rules.parse_key`, in Playwright's spelling ('Control+s')."""
    *mods, final = keys.strip().lower().split("+")
    name = KEYS.get(final) or (final.upper() if final.startswith("f") and final[1:].isdigit() else final)
    return "+".join([*(MODIFIERS[m] for m in mods), name])


class BrowserSource:
    kind: SourceKind = "browser"

    def __init__(self, router: Router, output_dir: Path) -> None:
        self.router = router
        self.frame_file = output_dir / FRAME_FILE

    async def _call(self, tool: str, arguments: dict[str, object]) -> CallToolResult:
        host = self.router.hosts.get(NAMESPACE)
        if host is None:
            raise SourceFailed("the browser toolset is not configured")
        try:
            result = await host.call(tool, dict(arguments), CALL_TIMEOUT_S)
        except ToolsetUnavailable as exc:
            raise SourceFailed(str(exc)) from None
        if result.is_error:
            said = " ".join(getattr(c, "text", "") for c in result.content)[:300]
            raise SourceFailed(f"{tool} failed: {said or 'no message'}")
        return result

    async def grab(self, max_side: int, quality: int, marks: bool = False) -> Frame:
        result = await self._call("browser_take_screenshot", {"type": "jpeg", "filename": str(self.frame_file)})
        image = next((c for c in result.content if isinstance(c, ImageContent)), None)
        if image is not None:
            data = base64.b64decode(image.data)
        else:  # given a file name, the server writes the image there and returns only its path
            try:
                data = await anyio.to_thread.run_sync(self.frame_file.read_bytes)
            except OSError as exc:
                raise SourceFailed(f"browser_take_screenshot wrote no image at {self.frame_file}: {exc}") from None
        sw, sh = await anyio.to_thread.run_sync(size_of, data)
        jpeg, w, h = await anyio.to_thread.run_sync(rescale_jpeg, data, max_side, quality)
        return Frame(jpeg, w, h, sw, sh, "browser")

    async def send(self, action: Action) -> None:
        if action.kind in ("click", "double_click"):
            count = 2 if action.kind == "double_click" else 1
            args: dict[str, object] = {"x": action.x, "y": action.y, "button": action.button, "clickCount": count}
            await self._call("browser_mouse_click_xy", args)
        elif action.kind == "scroll":
            await self._call("browser_mouse_move_xy", {"x": action.x, "y": action.y})
            dx, dy = WHEEL[action.direction]
            await self._call("browser_mouse_wheel", {"deltaX": dx, "deltaY": dy})
        elif action.kind == "key":
            await self._call("browser_press_key", {"key": playwright_key(action.keys)})
        else:  # typed text goes key by key: the keyboard's own events, into whatever has the focus
            for n, char in enumerate(action.text):
                try:
                    await self._call("browser_press_key", {"key": TYPED.get(char, char)})
                except SourceFailed:  # its message may quote the character: never say what was typed
                    raise SourceFailed(f"typing stopped after {n} of {len(action.text)} characters") from None

    async def close(self) -> None:
        return None
