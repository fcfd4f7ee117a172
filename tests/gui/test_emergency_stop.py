"""The emergency stop through the whole system on a real (virtual) display (issue 18): an
operator's `POST /v1/devices/{id}/stop` reaches the agent's `gui` toolset, which releases held
mouse buttons and modifiers; the model-facing catalogue has no `gui.resume`; the device resume
lets GUI work run again."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.gui.conftest import TkApp
from tests.gui.test_x11 import held
from tests.support import Fleet, wait_until

OBSERVE = {"id": "look", "placement": {"device": "es-desktop"}, "commands": [{"tool": "gui.observe"}]}


def test_a_stop_releases_held_buttons_and_modifiers_and_resume_lets_gui_work_run(
    tmp_path: Path, xvfb: str, tk_app: TkApp
) -> None:
    with Fleet(tmp_path, heartbeat_interval_s="1") as f:
        desktop = f.agent("es-desktop", extra_args=["--toolset", "gui", "--toolset", "system"], DISPLAY=xvfb)
        tools = {t["name"] for t in f.device(desktop.device_id)["tools"]}
        assert "gui.stop" in tools and "gui.resume" not in tools  # a model cannot lift a stop
        assert f.wait_task(f.submit({"nodes": [OBSERVE]})["id"])["state"] == "succeeded"  # the agent drives the display

        # Something left ctrl and button 1 pressed (an input cut short, a stuck remote session).
        pressed = asyncio.run(_xdotool(xvfb, "keydown", "ctrl", "mousedown", "1"))
        assert pressed == 0 and held(xvfb) != ([], 0)
        with f.server.client() as c:
            r = c.post(f"/v1/devices/{desktop.device_id}/stop", json={"reason": "the model misbehaves"})
            assert r.status_code == 200, r.text
        wait_until(lambda: held(xvfb) == ([], 0), 15, "held buttons and modifiers to be released")
        wait_until(lambda: "device stopped by an operator" in desktop.log(), 15, "the agent to log the stop")

        waiting = f.submit({"nodes": [OBSERVE]})
        with f.server.client() as c:
            assert c.post(f"/v1/devices/{desktop.device_id}/resume").status_code == 200
        assert f.wait_task(waiting["id"])["state"] == "succeeded"


async def _xdotool(display: str, *args: str) -> int:
    proc = await asyncio.create_subprocess_exec("xdotool", *args, env={**os.environ, "DISPLAY": display})
    return await proc.wait()
