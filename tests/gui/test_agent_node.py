"""An agent node with the (fake) LLM drives the GUI toolset through the whole system: orchestrator,
agent, MCP, X11 input on a real (virtual) display."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.fakellm import FakeLLM, call
from tests.gui.conftest import TkApp
from tests.support import Fleet, wait_until


def _last_observation(body: dict[str, Any]) -> str:
    """The observation id from the most recent tool result the model was shown."""
    for message in reversed(body["messages"]):
        if message.get("role") == "tool":
            found = re.search(r'"observation_id":\s*"([^"]+)"', message["content"])
            if found:
                return found.group(1)
    raise AssertionError("the model was not shown an observation")


def test_an_agent_node_clicks_a_button_in_two_steps(tmp_path: Path, xvfb: str, tk_app: TkApp) -> None:
    llm = FakeLLM()
    try:
        with Fleet(tmp_path, **llm.env()) as f:
            f.agent(
                "desktop",
                {"screen": "yes"},
                extra_args=["--toolset", "gui", "--toolset", "system", "--unattended"],
                DISPLAY=xvfb,
            )
            llm.add(
                call("gui__observe"),
                lambda body: call(
                    "gui__click", x=120, y=65, observation_id=_last_observation(body), action_id="press-the-button-1"
                ),
                call("finish", answer="pressed"),
            )
            dag = {
                "nodes": [
                    {
                        "id": "press",
                        "kind": "agent",
                        "placement": {"labels": {"screen": "yes"}},
                        "instruction": "Press the 'Press me' button once.",
                        "max_steps": 5,
                    }
                ]
            }
            done = f.wait_task(f.submit(dag)["id"], timeout=90)
            assert done["state"] == "succeeded", json.dumps(done["nodes"][0])[:2000]
            state = tk_app.wait_for(lambda s: s.get("clicks", 0) >= 1, "the click to land")
            assert state["clicks"] == 1
            tools = [t["function"]["name"] for t in llm.requests[0]["tools"]]
            assert "gui__observe" in tools and "gui__click" in tools
    finally:
        llm.close()


def test_an_attended_agent_node_asks_first_and_clicks_only_once_approved(
    tmp_path: Path, xvfb: str, tk_app: TkApp
) -> None:
    """Not `--unattended`: `gui.click` waits in the approvals queue with the screenshot it was
    planned on, and the model's own `approval.request` goes through the same queue (issue 18)."""
    llm = FakeLLM()
    try:
        with Fleet(tmp_path, **llm.env()) as f:
            f.agent("desktop", {"screen": "yes"}, extra_args=["--toolset", "gui", "--toolset", "system"], DISPLAY=xvfb)
            llm.add(
                call("approval__request", reason="I will press the 'Press me' button"),
                call("gui__observe"),
                lambda body: call(
                    "gui__click", x=120, y=65, observation_id=_last_observation(body), action_id="press-after-ok-1"
                ),
                call("finish", answer="pressed"),
            )
            dag = {
                "nodes": [
                    {
                        "id": "press",
                        "kind": "agent",
                        "placement": {"labels": {"screen": "yes"}},
                        "instruction": "Press the 'Press me' button once.",
                        "max_steps": 6,
                    }
                ]
            }
            task_id = f.submit(dag)["id"]
            with f.server.client() as c:

                def waiting(tool: str) -> dict[str, Any] | None:
                    items = c.get("/v1/approvals", params={"state": "pending", "task_id": task_id}).json()["items"]
                    return next((a for a in items if a["tool"] == tool), None)

                asked = wait_until(lambda: waiting("approval.request"), 60, "the model's own approval request")
                assert asked["reason"] == "I will press the 'Press me' button"
                assert f.node(f.task(task_id), "press")["state"] == "waiting_approval"
                assert c.post(f"/v1/approvals/{asked['id']}/approve").status_code == 200

                click = wait_until(lambda: waiting("gui.click"), 60, "the click to wait for approval")
                assert tk_app.state().get("clicks", 0) == 0  # nothing was pressed while it waits
                shot = c.get(click["screenshot_url"])
                assert shot.status_code == 200 and shot.headers["content-type"] == "image/png"
                assert shot.content.startswith(b"\x89PNG")
                assert c.post(f"/v1/approvals/{click['id']}/approve").status_code == 200

            done = f.wait_task(task_id, timeout=90)
            assert done["state"] == "succeeded", json.dumps(done["nodes"][0])[:2000]
            state = tk_app.wait_for(lambda s: s.get("clicks", 0) >= 1, "the click to land")
            assert state["clicks"] == 1
            tools = [t["function"]["name"] for t in llm.requests[0]["tools"]]
            assert "approval__request" in tools
    finally:
        llm.close()
