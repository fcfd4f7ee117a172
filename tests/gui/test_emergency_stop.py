"""The emergency stop through the whole system on a real (virtual) display (issue 18): an
operator's `POST /v1/devices/{id}/stop` reaches the agent's `gui` toolset, which releases held
mouse buttons and modifiers; the model-facing catalogue has no `gui.resume`; the device resume
lets GUI work run again."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.gui.conftest import TkApp
from tests.gui.test_x11 import centre, held
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


def press_after_looking(x: int, y: int, action_id: str) -> dict[str, object]:
    """Observe, then click (x, y) on that observation."""
    click = {"observation_id": "${nodes.look.output.observation_id}", "action_id": action_id, "x": x, "y": y}
    return {
        "nodes": [
            OBSERVE,
            {
                "id": "press",
                "placement": {"device": "es-desktop"},
                "commands": [{"tool": "gui.click", "arguments": click}],
            },
        ],
        "edges": [{"from": "look", "to": "press"}],
    }


def test_a_models_gui_stop_holds_until_an_operator_resumes_the_device(tmp_path: Path, xvfb: str, tk_app: TkApp) -> None:
    """`gui.stop` stays (harmless), `gui.resume` is gone: what a model stopped, only an operator's
    resume (here of a device that is not stopped) lifts."""
    x, y = centre(tk_app, "button")
    with Fleet(tmp_path, heartbeat_interval_s="1") as f:
        desktop = f.agent(
            "es-desktop", extra_args=["--toolset", "gui", "--toolset", "system", "--unattended"], DISPLAY=xvfb
        )
        halt = {"id": "halt", "placement": {"device": "es-desktop"}, "commands": [{"tool": "gui.stop"}]}
        assert f.wait_task(f.submit({"nodes": [halt]})["id"])["state"] == "succeeded"
        refused = f.wait_task(f.submit(press_after_looking(x, y, "press-0001"))["id"])
        press = f.node(refused, "press")
        assert press["state"] == "failed" and press["error"]["code"] == "stopped", press
        assert "operator resumes the device" in press["error"]["message"]
        before = tk_app.state()["clicks"]

        with f.server.client() as c:
            r = c.post(f"/v1/devices/{desktop.device_id}/resume")
            assert r.status_code == 200 and r.json()["admin_state"] == "active", r.text
        wait_until(lambda: "device resumed by an operator" in desktop.log(), 15, "the agent to hear the resume")
        done = f.wait_task(f.submit(press_after_looking(x, y, "press-0002"))["id"])
        assert done["state"] == "succeeded", f.node(done, "press")
        tk_app.wait_for(lambda s: s["clicks"] == before + 1, "the click after the resume")
