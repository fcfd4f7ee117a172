"""Double click, scroll and drag, and the window tools (windows, focus_window, launch), driven for
real on Xvfb with xdotool; the Tk app's state file says what actually arrived (issue 19)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio

from device_agent.toolsets.gui import windows
from tests.gui.conftest import TK_APP, TkApp
from tests.gui.fakes import code, data, make_ctx
from tests.gui.test_x11 import at, centre, gui, next_oid, observe


async def test_double_click_scroll_and_drag_arrive_as_real_events(xvfb: str, tk_app: TkApp, tmp_path: Path) -> None:
    x, y = centre(tk_app, "entry")
    async with gui(xvfb, tmp_path) as client:
        oid = (await observe(client))["observation_id"]
        result = await client.call_tool("double_click", at(oid, "double-0001", (x, y)))
        oid = next_oid(result)
        tk_app.wait_for(lambda s: s["double_clicks"] == 1, "a double click")

        args = at(oid, "scroll-0001", (x, y)) | {"direction": "down", "amount": 2}
        oid = next_oid(await client.call_tool("scroll", args))
        state = tk_app.wait_for(lambda s: len(s["wheel"]) == 2, "two wheel steps")
        assert all(w == {"x": x, "y": y, "button": 5} for w in state["wheel"])

        args = at(oid, "drag-000001", (60, 200)) | {"to_x": 400, "to_y": 260}
        next_oid(await client.call_tool("drag", args))
        state = tk_app.wait_for(lambda s: (s["last_release"] or {}).get("x") == 400, "the drag's release")
        assert state["last_click"] == {"x": 60, "y": 200, "button": 1}
        assert state["last_release"] == {"x": 400, "y": 260, "button": 1}
        assert state["dragged"] >= 1  # the pointer moved with the button held


async def test_windows_are_listed_and_focused(xvfb: str, tk_app: TkApp, tmp_path: Path) -> None:
    async with gui(xvfb, tmp_path) as client:
        listed = data(await client.call_tool("windows", {}))["windows"]
        by_title = {w["title"]: w for w in listed}
        assert {"Orrery test app", "Second window"} <= set(by_title), listed
        assert by_title["Orrery test app"]["focused"] is True and by_title["Second window"]["focused"] is False
        assert by_title["Second window"]["bounds"][2:] == [320, 200]

        oid = (await observe(client))["observation_id"]
        second = by_title["Second window"]["id"]
        result = await client.call_tool("focus_window", {"window_id": second})
        assert not result.is_error and data(result)["focused"] is True, data(result)
        tk_app.wait_for(lambda s: s["focused"] == "second", "the second window to get the focus")
        # The observation from before the focus change is void.
        result = await client.call_tool("click", at(oid, "after-focus-1", (5, 5)))
        assert code(result) == "stale_observation"

        result = await client.call_tool("focus_window", {"window_id": 12345})
        assert code(result) == "invalid_arguments" and "gui.windows" in data(result)["message"]


async def test_launch_applies_the_shell_policy_and_never_a_shell(xvfb: str, tmp_path: Path) -> None:
    state = tmp_path / "launched.json"
    ctx = make_ctx(tmp_path, shell_allow=(sys.executable,))
    async with gui(xvfb, tmp_path, ctx=ctx) as client:
        refused = await client.call_tool("launch", {"argv": ["sh", "-c", f"touch {tmp_path / 'canary'}"]})
        assert code(refused) == "policy_denied" and "allow list" in data(refused)["message"]
        assert not (tmp_path / "canary").exists()
        assert code(await client.call_tool("launch", {"argv": []})) == "invalid_arguments"

        result = await client.call_tool("launch", {"argv": [sys.executable, str(TK_APP), str(state)]})
        assert not result.is_error, data(result)
        pid = data(result)["pid"]
        try:
            launched = TkApp(None, state)  # type: ignore[arg-type]  # the agent started it, not the test
            launched.wait_for(lambda s: s.get("ready"), "the launched app to start", 15)
            listed = data(await client.call_tool("windows", {}))["windows"]
            assert "Orrery test app" in [w["title"] for w in listed]
            # A stopped device launches nothing.
            await client.call_tool("stop", {})
            halted = await client.call_tool("launch", {"argv": [sys.executable, str(TK_APP), str(state)]})
            assert code(halted) == "stopped"
        finally:
            os.killpg(pid, signal.SIGTERM)  # the app runs in its own session, detached from the agent
            with anyio.fail_after(10):
                while windows.launched:  # reaped by the toolset once it exits
                    await anyio.sleep(0.05)
