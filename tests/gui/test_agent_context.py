"""The model's context in an agent node, through the whole system: orchestrator, fake LLM over real
HTTP, agent, the gui toolset on a real (virtual) 1280x800 display. The model is shown screenshots
scaled to at most 640 px, only the newest stays an image, and its click at shown coordinates lands
on the device pixel the mapping names (issue 19)."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import Any

from PIL import Image

from tests.fakellm import FakeLLM, call
from tests.gui.conftest import TkApp
from tests.support import Fleet, run_cli


def images(body: dict[str, Any]) -> list[Image.Image]:
    found = []
    for message in body["messages"]:
        if isinstance(message.get("content"), list):
            for part in message["content"]:
                if part.get("type") == "image_url":
                    url = part["image_url"]["url"]
                    found.append(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))
    return found


def notes(body: dict[str, Any]) -> list[str]:
    return [
        m["content"]
        for m in body["messages"]
        if isinstance(m.get("content"), str) and m["content"].startswith("[An earlier screenshot")
    ]


def last_observation(body: dict[str, Any]) -> str:
    for message in reversed(body["messages"]):
        if message.get("role") == "tool":
            found = re.search(r'"observation_id":\s*"([^"]+)"', message["content"])
            if found:
                return found.group(1)
    raise AssertionError("the model was not shown an observation")


def test_only_the_newest_screenshot_stays_scaled_and_a_shown_click_lands_on_the_mapped_pixel(
    tmp_path: Path, xvfb: str, tk_app: TkApp
) -> None:
    llm = FakeLLM()
    try:
        env = llm.env(llm_vision="true", llm_screenshot_max_side="640")
        with Fleet(tmp_path, **env) as f:
            f.agent("desktop", {"screen": "yes"}, extra_args=["--toolset", "gui", "--unattended"], DISPLAY=xvfb)
            llm.add(
                call("gui__observe"),
                call("gui__observe"),
                call("gui__observe"),
                # (61, 33) in the 640x400 image the model sees is (123, 67) on the 1280x800 screen:
                # inside the "Press me" button (40..200, 40..90); unmapped, y 33 would miss it.
                lambda body: call(
                    "gui__click", x=61, y=33, observation_id=last_observation(body), action_id="press-scaled-1"
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
                        "max_steps": 8,
                    }
                ]
            }
            task_id = f.submit(dag)["id"]
            done = f.wait_task(task_id, timeout=90)
            assert done["state"] == "succeeded", json.dumps(done["nodes"][0])[:2000]
            state = tk_app.wait_for(lambda s: s.get("clicks", 0) >= 1, "the click to land")
            assert state["clicks"] == 1 and state["last_click"] == {"x": 123, "y": 67, "button": 1}

            bodies = llm.requests
            assert len(bodies) == 5
            assert [len(images(b)) for b in bodies] == [0, 1, 1, 1, 1]
            assert [len(notes(b)) for b in bodies] == [0, 0, 1, 2, 3]
            assert all(i.size == (640, 400) for b in bodies for i in images(b))
            first = notes(bodies[-1])[0]
            assert "640x400 pixels (scaled from 1280x800)" in first and "Next you called gui.observe" in first
            assert "Next you called gui.click(x=61, y=33)" in notes(bodies[-1])[-1]
            shown = next(json.loads(m["content"]) for m in bodies[1]["messages"] if m.get("role") == "tool")
            assert (shown["result"]["width"], shown["result"]["height"]) == (640, 400)
            assert "data" not in json.dumps(shown["result"]["images"])

            with f.server.client() as c:
                calls = c.get(f"/v1/tasks/{task_id}/llm").json()["items"]
            tokens = [item["prompt_tokens"] for item in calls]
            assert len(tokens) == 5 and all(t > 0 for t in tokens)
            # The context stays bounded: three more observations cost less than one image.
            image_tokens = len(json.dumps(images_urls(bodies[1]))) // 4
            assert tokens[4] - tokens[1] < image_tokens, (tokens, image_tokens)
            shown_llm = run_cli(f, "tasks", "show", task_id, "--llm")
            assert shown_llm.returncode == 0, shown_llm.stderr
            assert f"{tokens[4]}+20 tokens" in shown_llm.stdout
    finally:
        llm.close()


def images_urls(body: dict[str, Any]) -> list[str]:
    return [
        part["image_url"]["url"]
        for m in body["messages"]
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "image_url"
    ]
