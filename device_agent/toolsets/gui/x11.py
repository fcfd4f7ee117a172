"""The X11 backend: python-xlib reads the screen's state, mss captures it, xdotool sends input.

Why these three: mss captures the root window through XCB in a few milliseconds and encodes PNG
with the standard library only (no Pillow); python-xlib is pure Python and answers "which window
has the keyboard focus, what is its title, how big is the screen" in-process, without parsing a
helper's output; xdotool (Debian package) is the de facto XTEST client and is run as a plain argv
list, never through a shell, with its own process group so a cancel kills it.

Blocking X calls run in worker threads so the agent's event loop keeps serving heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.to_thread

from device_agent.policy import Policy, child_env
from device_agent.toolsets.base import ProcessTracker
from device_agent.toolsets.gui.rules import RELEASE_ARGV, Gesture, GuiError, xdotool_argv

RELEASE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Screen:
    """What an input must still find: the same screen size and the same focused window."""

    width: int
    height: int
    window_id: int | None
    title: str

    def same_world(self, other: Screen) -> bool:
        """Title changes (an unread counter) do not count; size and focused window do."""
        return (self.width, self.height, self.window_id) == (other.width, other.height, other.window_id)


class InputFailed(Exception):
    """An input did not complete; it may have been partly delivered."""


class Backend(Protocol):
    """What the controller needs from a display (the X11 one below, or a fake in tests)."""

    display: str

    async def status(self) -> Screen: ...
    async def capture(self) -> tuple[bytes, int, int]: ...
    async def send(self, gesture: Gesture) -> None: ...
    async def release(self) -> None: ...
    def interrupt(self) -> bool: ...


def _toplevel(display: Any, window: Any, root: Any) -> Any:
    """The window to identify: the nearest named ancestor-or-self, else the child of the root."""
    chain = []
    while window is not None and window.id != root.id:
        chain.append(window)
        window = window.query_tree().parent
    named = next((w for w in chain if window_title(display, w)), None)
    return named or (chain[-1] if chain else None)


def window_title(display: Any, window: Any) -> str:
    net_name = window.get_full_property(display.intern_atom("_NET_WM_NAME"), 0)
    if net_name is not None and net_name.value:
        value = net_name.value
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    name = window.get_wm_name()
    return name.decode("latin-1") if isinstance(name, bytes) else str(name or "")


def read_screen(display_name: str) -> Screen:
    """Screen size and focused top-level window, read with python-xlib (blocking)."""
    from Xlib import X
    from Xlib import display as xdisplay
    from Xlib import error as xerror

    try:
        display = xdisplay.Display(display_name)
    except Exception as exc:  # DisplayError, ConnectionClosedError (a resetting server), OSError...
        raise GuiError("tool_error", f"cannot connect to X display {display_name!r}: {exc}; try again") from exc
    try:
        screen = display.screen()
        root = screen.root
        focus = display.get_input_focus().focus
        if isinstance(focus, int) or focus in (X.NONE, X.PointerRoot) or focus.id == root.id:
            # No explicit focus (no window manager): keys go to the window under the pointer.
            child = root.query_pointer().child
            focus = None if isinstance(child, int) or child in (X.NONE,) else child
        window = _toplevel(display, focus, root) if focus is not None else None
        title = window_title(display, window) if window is not None else ""
        return Screen(screen.width_in_pixels, screen.height_in_pixels, window.id if window else None, title)
    except xerror.XError as exc:  # the window vanished while we looked: the caller observes again
        raise GuiError("tool_error", f"the screen changed while it was being read ({exc}); try again") from exc
    except Exception as exc:  # the connection broke (ConnectionClosedError, OSError)
        raise GuiError("tool_error", f"lost the connection to X display {display_name!r}: {exc}; try again") from exc
    finally:
        display.close()


# A screenshot PNG larger than this is made smaller (its base64, ~2.7 MiB, must stay under the
# result's image cap, `router.MAX_IMAGE_BYTES`, or the model would see no screenshot at all).
MAX_SCREENSHOT_PNG_BYTES = 2 * 1024 * 1024
MAX_SHRINK = 8


def grab_png(display_name: str) -> tuple[bytes, int, int]:
    """A PNG of the whole X screen, with the PNG's own size (blocking). A large screen's is shrunk
    by 2, 4 or 8 to fit `MAX_SCREENSHOT_PNG_BYTES`; coordinates map back through `rules.to_device`."""
    import mss

    try:
        with mss.MSS(display=display_name) as sct:
            shot = sct.grab(sct.monitors[0])
            return fit_png(shot.rgb, shot.width, shot.height)
    except GuiError:
        raise
    except Exception as exc:  # mss raises ScreenShotError, ctypes errors, OSError...
        raise GuiError("tool_error", f"cannot capture X display {display_name!r}: {exc}") from exc


def fit_png(rgb: bytes, width: int, height: int, budget: int = MAX_SCREENSHOT_PNG_BYTES) -> tuple[bytes, int, int]:
    """`rgb` (3 bytes a pixel, row by row) as a PNG of at most `budget` bytes if shrinking it by a
    power of two up to `MAX_SHRINK` can do it (every k-th pixel of every k-th row), with its size."""
    import mss.tools

    k, data, w, h = 1, rgb, width, height
    while True:
        png = mss.tools.to_png(data, (w, h), level=6)
        assert png is not None  # to_png returns bytes when no output file is given
        if len(png) <= budget or k >= MAX_SHRINK:
            return png, w, h
        k *= 2
        data, w, h = shrink(rgb, width, height, k)


def shrink(rgb: bytes, width: int, height: int, k: int) -> tuple[bytes, int, int]:
    """Every k-th pixel of every k-th row of an RGB image (strided slices: C speed per row)."""
    w = (width + k - 1) // k
    stride = 3 * width
    out = bytearray(3 * w * ((height + k - 1) // k))
    row_out = 3 * w
    for n, y in enumerate(range(0, height, k)):
        row = rgb[y * stride : (y + 1) * stride]
        at = n * row_out
        for c in range(3):
            out[at + c : at + row_out : 3] = row[c :: 3 * k]
    return bytes(out), w, (height + k - 1) // k


class X11Backend:
    """Input and capture on one X display, with `xdotool` as the only input path."""

    def __init__(
        self,
        display: str,
        processes: ProcessTracker | None = None,
        policy: Callable[[], Policy] = Policy,
        xdotool: str = "xdotool",
    ) -> None:
        self.display = display
        self.xdotool = xdotool
        self._processes = processes or ProcessTracker()
        # Read at call time (the agent may swap its policy): it says which variables to scrub.
        self._policy = policy
        self._current: asyncio.subprocess.Process | None = None
        self._in_send = False
        self._interrupted = False

    async def status(self) -> Screen:
        """Screen size and focused window."""
        return await anyio.to_thread.run_sync(read_screen, self.display)

    async def capture(self) -> tuple[bytes, int, int]:
        """A PNG of the screen and its size."""
        return await anyio.to_thread.run_sync(grab_png, self.display)

    async def send(self, gesture: Gesture) -> None:
        """Perform one gesture; raises `InputFailed` if xdotool fails, times out or is killed."""
        timeout = 10.0 + 0.03 * len(gesture.text)  # xdotool types one character per 12 ms
        self._in_send, self._interrupted = True, False
        try:
            await self._xdotool(xdotool_argv(gesture), timeout, track=True, quiet=gesture.kind == "type")
        finally:
            self._in_send = False

    async def release(self) -> None:
        """Release mouse buttons 1-3 and ctrl/alt/shift/super (after an error or cancel)."""
        await self._xdotool(RELEASE_ARGV, RELEASE_TIMEOUT_S, track=False)

    def interrupt(self) -> bool:
        """Kill the input in flight, if any (for `gui.stop`); True if one was running.

        An input still starting its xdotool is marked, and killed as soon as it has a pid.
        """
        if not self._in_send:
            return False
        self._interrupted = True
        proc = self._current
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        return True

    async def _xdotool(self, args: list[str], timeout: float, *, track: bool, quiet: bool = False) -> None:
        env = self._processes.environment({**child_env(self._policy(), os.environ), "DISPLAY": self.display})
        try:
            proc = await asyncio.create_subprocess_exec(
                self.xdotool,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
                preexec_fn=self._processes.preexec(),
            )
        except OSError as exc:
            raise InputFailed(f"cannot run {self.xdotool}: {exc.strerror}") from exc
        if track:
            self._current = proc
            if self._interrupted:  # gui.stop came while the process was being started
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        try:
            self._processes.add(proc)  # recorded in the ledger; if it cannot be, the finally reaps it
            with anyio.fail_after(timeout):
                _, err = await proc.communicate()
        except TimeoutError as exc:
            raise InputFailed(f"xdotool did not finish within {timeout:g} s") from exc
        finally:
            if proc.returncode is None:  # timed out or cancelled: the whole group goes
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    await proc.wait()
            self._processes.discard(proc)
            if track:
                self._current = None
        if proc.returncode != 0:
            # xdotool's own complaint (e.g. "Can't open display"); dropped for `type`, where it
            # could quote the typed text.
            first = [] if quiet else (err or b"").decode("utf-8", "replace").strip().splitlines()[:1]
            raise InputFailed(f"xdotool exited with {proc.returncode}: {first[0][:200] if first else 'no message'}")
