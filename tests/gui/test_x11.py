"""T2: the gui toolset on a real X server (Xvfb), xdotool input and an instrumented Tk app.

Everything goes through a real MCP client against the real display; the Tk app's state file is
the ground truth of what the input did.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.types import CallToolResult, ImageContent

from device_agent.toolsets.base import ToolsetContext
from device_agent.toolsets.gui import build, check
from device_agent.toolsets.gui.x11 import X11Backend
from tests.gui.conftest import TkApp
from tests.gui.fakes import code, data, make_ctx

ROOT = Path(__file__).resolve().parents[2]


class ShiftedClock:
    """time.monotonic, plus an offset a test can move forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@asynccontextmanager
async def gui(
    display: str,
    tmp: Path,
    clock: ShiftedClock | None = None,
    xdotool: str = "xdotool",
    ctx: ToolsetContext | None = None,
) -> AsyncIterator[Client]:
    """`ctx`: pass one to reach its `stop_latch` (the device-level emergency stop and resume)."""
    backend = X11Backend(display, xdotool=xdotool)
    ctx = ctx or make_ctx(tmp)
    server = build(ctx, backend=backend, clock=clock or ShiftedClock(), lock_dir=tmp / "locks", settle_s=0.1)
    async with Client(server) as client:
        yield client


async def observe(client: Client) -> dict[str, Any]:
    result = await client.call_tool("observe", {})
    assert not result.is_error, result.content
    return data(result)


def at(oid: str, action_id: str, point: tuple[int, int]) -> dict[str, Any]:
    """Arguments of a click at `point` on observation `oid`."""
    return {"observation_id": oid, "action_id": action_id, "x": point[0], "y": point[1]}


def frame(display: str, window: int) -> int:
    """The X window a user sees for a Tk toplevel: with no window manager, the parent of Tk's own."""
    from Xlib import display as xdisplay

    conn = xdisplay.Display(display)
    try:
        return int(conn.create_resource_object("window", window).query_tree().parent.id)
    finally:
        conn.close()


def centre(app: TkApp, widget: str) -> tuple[int, int]:
    x, y, w, h = app.state()["widgets"][widget]
    return x + w // 2, y + h // 2


def next_oid(result: CallToolResult) -> str:
    assert not result.is_error, data(result)
    return str(data(result)["observation"]["observation_id"])


def held(display: str) -> tuple[list[int], int]:
    """Keycodes that are down and the pointer's button mask, read with python-xlib."""
    from Xlib import X
    from Xlib import display as xdisplay

    conn = xdisplay.Display(display)
    try:
        keymap = conn.query_keymap()
        keys = [i * 8 + bit for i, byte in enumerate(keymap) for bit in range(8) if byte >> bit & 1]
        buttons = conn.screen().root.query_pointer().mask & (X.Button1Mask | X.Button2Mask | X.Button3Mask)
        return keys, buttons
    finally:
        conn.close()


async def test_observe_click_type_and_key_on_a_real_display(xvfb: str, tk_app: TkApp, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    text = f'it\'s "quoted" $(touch {canary}) ; touch {canary} `touch {canary}` | & < > \\ done'
    async with gui(xvfb, tmp_path) as client:
        result = await client.call_tool("observe", {})
        assert isinstance(result.content[0], ImageContent)
        obs = data(result)
        assert (obs["width"], obs["height"]) == (1280, 800)
        assert obs["focused_window"]["id"] == frame(xvfb, tk_app.state()["windows"]["main"])
        assert obs["focused_window"]["title"] == "Orrery test app"

        x, y = centre(tk_app, "button")
        clicked = await client.call_tool(
            "click", {"observation_id": obs["observation_id"], "action_id": "click-001", "x": x, "y": y}
        )
        state = tk_app.wait_for(lambda s: s["clicks"] == 1, "the button click")
        assert state["last_click"] == {"x": x, "y": y, "button": 1}  # identity mapping, exact pixel

        x, y = centre(tk_app, "entry")
        focused = await client.call_tool(
            "click", {"observation_id": next_oid(clicked), "action_id": "click-002", "x": x, "y": y}
        )
        typing = {"observation_id": next_oid(focused), "action_id": "type-0001", "text": text}
        typed = await client.call_tool("type", typing)
        tk_app.wait_for(lambda s: s["entry"] == text, "the typed text, byte-exact")
        retried = await client.call_tool("type", typing)  # a retry of the same action types nothing
        assert data(retried)["replayed"] is True

        pressed = await client.call_tool(
            "key", {"observation_id": next_oid(typed), "action_id": "key-00001", "key": "backspace"}
        )
        tk_app.wait_for(lambda s: s["entry"] == text[:-1], "backspace, after exactly one copy of the text")
        await client.call_tool("key", {"observation_id": next_oid(pressed), "action_id": "key-00002", "key": "ctrl+s"})
        state = tk_app.wait_for(lambda s: s["keys"][-1:] == [{"keysym": "s", "ctrl": True, "shift": False}], "ctrl+s")
        assert state["entry"] == text[:-1]
    assert not canary.exists()  # nothing the text says was ever run
    assert held(xvfb) == ([], 0)  # --clearmodifiers put nothing back down


async def test_stale_and_reused_observations_and_focus_changes_are_refused(
    xvfb: str, tk_app: TkApp, tmp_path: Path
) -> None:
    clock = ShiftedClock()
    x, y = centre(tk_app, "button")
    async with gui(xvfb, tmp_path, clock) as client:
        old = (await observe(client))["observation_id"]
        clock.offset += 61
        assert (
            code(await client.call_tool("click", {"observation_id": old, "action_id": "click-001", "x": x, "y": y}))
            == "stale_observation"
        )

        oid = (await observe(client))["observation_id"]
        assert not (
            await client.call_tool("click", {"observation_id": oid, "action_id": "click-002", "x": x, "y": y})
        ).is_error
        tk_app.wait_for(lambda s: s["clicks"] == 1, "the click")
        reused = await client.call_tool("click", {"observation_id": oid, "action_id": "click-003", "x": x, "y": y})
        assert code(reused) == "stale_observation"

        oid = (await observe(client))["observation_id"]
        second = frame(xvfb, tk_app.state()["windows"]["second"])
        focus = await asyncio.create_subprocess_exec(
            "xdotool", "windowfocus", "--sync", str(second), env={**os.environ, "DISPLAY": xvfb}
        )
        assert await focus.wait() == 0
        tk_app.wait_for(lambda s: s["focused"] == "second", "the second window to take the focus")
        changed = await client.call_tool("click", {"observation_id": oid, "action_id": "click-004", "x": x, "y": y})
        assert code(changed) == "stale_observation"
        assert "Second window" in data(changed)["message"]
    assert tk_app.state()["clicks"] == 1


async def test_stop_blocks_input_until_resume_and_a_new_observation(xvfb: str, tk_app: TkApp, tmp_path: Path) -> None:
    x, y = centre(tk_app, "button")
    ctx = make_ctx(tmp_path)
    async with gui(xvfb, tmp_path, ctx=ctx) as client:
        oid = (await observe(client))["observation_id"]
        assert data(await client.call_tool("stop", {}))["stopped"] is True
        assert (
            code(await client.call_tool("click", {"observation_id": oid, "action_id": "click-001", "x": x, "y": y}))
            == "stopped"
        )
        oid = (await observe(client))["observation_id"]
        assert (
            code(await client.call_tool("click", {"observation_id": oid, "action_id": "click-002", "x": x, "y": y}))
            == "stopped"
        )
        assert (await client.call_tool("resume", {})).is_error  # no such tool: a model cannot lift a stop
        ctx.stop_latch.lift()  # the device-level resume (an operator's `device_resume`)
        assert (
            code(await client.call_tool("click", {"observation_id": oid, "action_id": "click-003", "x": x, "y": y}))
            == "stale_observation"
        )
        oid = (await observe(client))["observation_id"]
        assert not (
            await client.call_tool("click", {"observation_id": oid, "action_id": "click-004", "x": x, "y": y})
        ).is_error
        tk_app.wait_for(lambda s: s["clicks"] == 1, "the click after resume")


async def test_an_emergency_stop_releases_held_buttons_and_modifiers_and_latches_input(
    xvfb: str, tk_app: TkApp, tmp_path: Path
) -> None:
    """The device-level stop (an operator's `device_stop`, through `ctx.stop_latch`) releases a
    held modifier and mouse button on the real display, and input stays refused until the
    device-level resume: no tool lifts it."""
    x, y = centre(tk_app, "button")
    ctx = make_ctx(tmp_path)
    async with gui(xvfb, tmp_path, ctx=ctx) as client:
        oid = (await observe(client))["observation_id"]
        # Something left ctrl and button 1 pressed (an input cut short, a stuck remote session).
        press = await asyncio.create_subprocess_exec(
            "xdotool", "keydown", "ctrl", "mousedown", "1", env={**os.environ, "DISPLAY": xvfb}
        )
        assert await press.wait() == 0
        assert held(xvfb) != ([], 0)
        await ctx.stop_latch.engage("stopped by an operator (key k_test): runaway clicks")
        assert held(xvfb) == ([], 0)
        refused = await client.call_tool("click", {"observation_id": oid, "action_id": "click-001", "x": x, "y": y})
        assert code(refused) == "stopped"
        assert "operator resumes the device" in data(refused)["message"]
        oid = (await observe(client))["observation_id"]  # observing still works while stopped
        ctx.stop_latch.lift()
        oid = (await observe(client))["observation_id"]
        before = tk_app.state()["clicks"]
        assert not (
            await client.call_tool("click", {"observation_id": oid, "action_id": "click-002", "x": x, "y": y})
        ).is_error
        tk_app.wait_for(lambda s: s["clicks"] == before + 1, "the click after the resume")


async def test_held_buttons_and_modifiers_are_released_after_a_failure(
    xvfb: str, tk_app: TkApp, tmp_path: Path
) -> None:
    # An xdotool that dies half-way through typing, leaving ctrl and button 1 held down.
    wrapper = tmp_path / "xdotool-crashing"
    wrapper.write_text(
        f"#!{sys.executable}\n"
        "import os, subprocess, sys\n"
        "if sys.argv[1:2] == ['type']:\n"
        "    subprocess.run(['xdotool', 'keydown', 'ctrl', 'mousedown', '1'], check=True)\n"
        "    sys.exit(1)\n"
        "os.execvp('xdotool', ['xdotool', *sys.argv[1:]])\n"
    )
    wrapper.chmod(0o755)
    x, y = centre(tk_app, "entry")
    async with gui(xvfb, tmp_path, xdotool=str(wrapper)) as client:
        oid = (await observe(client))["observation_id"]
        clicked = await client.call_tool("click", {"observation_id": oid, "action_id": "click-001", "x": x, "y": y})
        typing = {"observation_id": next_oid(clicked), "action_id": "type-0001", "text": "never"}
        failed = await client.call_tool("type", typing)
        assert code(failed) == "uncertain"
        # The crash really pressed (the app saw a second press), and the toolset released it all.
        tk_app.wait_for(lambda s: s["last_click"]["button"] == 1, "the crashed input's press")
        assert held(xvfb) == ([], 0)
        assert code(await client.call_tool("type", typing)) == "uncertain"  # never replayed
    assert tk_app.state()["entry"] == ""


async def test_one_controller_per_display_across_processes(xvfb: str, tmp_path: Path) -> None:
    holder_args = [
        sys.executable,
        "-m",
        "tests.gui.lock_holder",
        xvfb,
        str(tmp_path / "locks"),
        str(tmp_path / "other"),
    ]

    def start_holder() -> subprocess.Popen[str]:
        return subprocess.Popen(holder_args, cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)

    async with gui(xvfb, tmp_path) as client:
        await observe(client)
        refused = start_holder()
        out, _ = refused.communicate(timeout=30)
        assert json.loads(out) == {"is_error": True, "code": "busy"}

    holder = start_holder()  # our toolset closed: the other process gets the display and keeps it
    try:
        assert holder.stdout is not None
        assert json.loads(holder.stdout.readline()) == {"is_error": False, "code": None}
        async with gui(xvfb, tmp_path) as client:
            assert code(await client.call_tool("observe", {})) == "busy"
            os.killpg(holder.pid, signal.SIGKILL)  # the OS frees the lock of a killed holder
            holder.wait(10)
            await observe(client)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate()  # reaps it and closes its pipe


def test_check_takes_a_real_screenshot_and_deletes_it(xvfb: str, tmp_path: Path) -> None:
    report = check(make_ctx(tmp_path), xvfb)
    assert report["ready"] is True, report["reason"]
    assert report["screen"]["width"] == 1280 and report["display_lock"] == "free"
    assert list((tmp_path / "data" / "screenshots").iterdir()) == []


def test_agent_check_flag(xvfb: str, tmp_path: Path) -> None:
    base = [sys.executable, "-m", "orrery", "agent", "--check", "--data-dir", str(tmp_path / "agent")]
    toolsets = [arg for name in ("system", "shell", "files", "gui") for arg in ("--toolset", name)]
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    ok = subprocess.run(
        [*base, *toolsets],
        env={**env, "DISPLAY": xvfb},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["ready"] is True and set(report["toolsets"]) == {"system", "shell", "files", "gui"}
    assert "observe" in report["toolsets"]["gui"]["tools"]

    bad = subprocess.run(
        [*base, "--toolset", "gui"], env=env, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert report["ready"] is False and "DISPLAY is not set" in report["toolsets"]["gui"]["reason"]
    assert "DISPLAY is not set" in bad.stderr
