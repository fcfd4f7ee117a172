"""Windows and applications: list the top-level windows, focus one, launch a program.

Windows are read with python-xlib: `_NET_CLIENT_LIST` when a window manager publishes it, else
the mapped children of the root window that have a title (a bare X server such as Xvfb).
Focusing raises the window and gives it the input focus (xdotool `windowraise` and `windowfocus`,
argv lists, never a shell). Launching runs an argv list under the agent's shell policy
(`shell_allow` / `shell_deny`, `check_program`), detached in its own session, with the policy's
scrubbed environment: never a shell string.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import anyio.to_thread

from device_agent.policy import Policy, PolicyDenied, check_program, child_env
from device_agent.toolsets.gui.rules import GuiError
from device_agent.toolsets.gui.x11 import read_screen, window_title

MAX_WINDOWS = 100
MAX_ARGS = 32


def list_windows(display_name: str) -> list[dict[str, Any]]:
    """Top-level windows with a title: id, title, pid (when published), geometry, focused (blocking)."""
    from Xlib import X
    from Xlib import display as xdisplay

    try:
        display = xdisplay.Display(display_name)
    except Exception as exc:
        raise GuiError("tool_error", f"cannot connect to X display {display_name!r}: {exc}; try again") from exc
    try:
        root = display.screen().root
        clients = root.get_full_property(display.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
        if clients is not None and len(clients.value):
            candidates = [display.create_resource_object("window", int(w)) for w in clients.value]
        else:
            candidates = list(root.query_tree().children)
        focused = read_screen(display_name).window_id
        out: list[dict[str, Any]] = []
        for window in candidates:
            try:
                if window.get_attributes().map_state != X.IsViewable:
                    continue
                title = window_title(display, window)
                if not title:
                    continue
                geometry = window.get_geometry()
                pid = window.get_full_property(display.intern_atom("_NET_WM_PID"), X.AnyPropertyType)
                out.append(
                    {
                        "id": int(window.id),
                        "title": title[:200],
                        "pid": int(pid.value[0]) if pid is not None and len(pid.value) else None,
                        "bounds": [geometry.x, geometry.y, geometry.width, geometry.height],
                        "focused": int(window.id) == focused,
                    }
                )
            except Exception:
                continue
            if len(out) >= MAX_WINDOWS:
                break
        return out
    finally:
        display.close()


async def windows(display: str) -> list[dict[str, Any]]:
    return await anyio.to_thread.run_sync(list_windows, display)


def check_launch(policy: Policy, argv: list[str]) -> None:
    """An argv the shell policy allows, or `invalid_arguments` / `policy_denied`."""
    if not argv or not argv[0] or len(argv) > MAX_ARGS or any("\x00" in a or len(a) > 4096 for a in argv):
        raise GuiError(
            "invalid_arguments",
            f"argv must be a list of 1-{MAX_ARGS} strings without NUL characters, the program first "
            "(e.g. ['gedit', 'notes.txt']); it is run directly, never through a shell",
        )
    try:
        check_program(policy, argv[0])
    except PolicyDenied as exc:
        raise GuiError(exc.code, str(exc)) from exc


# Reapers of the applications started by gui.launch, while they run (tests wait on it).
launched: set[asyncio.Task[int]] = set()


async def launch(argv: list[str], display: str, policy: Policy) -> int:
    """Start `argv` on `display`, detached; returns its pid. Refused unless the policy allows argv[0]."""
    check_launch(policy, argv)
    env = {**child_env(policy, os.environ), "DISPLAY": display}
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise GuiError("invalid_arguments", f"program {argv[0][:80]!r} was not found on this device's PATH") from None
    except OSError as exc:
        raise GuiError("tool_error", f"cannot start {argv[0][:80]!r}: {exc.strerror}") from exc
    # The application outlives the call (and the task that asked for it): reap it when it exits.
    reaper = asyncio.ensure_future(proc.wait())
    launched.add(reaper)
    reaper.add_done_callback(launched.discard)
    return int(proc.pid)
