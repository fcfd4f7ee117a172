"""See and take over, end to end under Xvfb and Chromium: a real orchestrator, real agents with the
gui toolset on a virtual display driving a Tk app, the fake LLM, and the dashboard in a real
headless Chromium. A live view in the browser changes when the app changes; a takeover in the
middle of an agent node pauses it, a click through the live view reaches the app, and the handback
makes the model observe again before the task succeeds; a failed GUI attempt leaves a recording
the browser plays and a successful one none; a view of another device is refused; a device whose
owner forbids watching refuses it."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakellm import FakeLLM, call
from tests.gui.conftest import TkApp
from tests.support import Agent, Fleet, wait_until
from tests.web.conftest import browser, watching  # noqa: F401 (browser: a fixture)

GUI = ["--toolset", "gui", "--toolset", "system"]
WEBM_MAGIC = b"\x1a\x45\xdf\xa3"  # EBML


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    fake = FakeLLM()
    try:
        yield fake
    finally:
        fake.close()


def desktop(fleet: Fleet, xvfb: str, name: str = "desktop", *extra: str, **env: str) -> Agent:
    agent = fleet.agent(name, {"screen": "yes"}, extra_args=[*GUI, *extra], DISPLAY=xvfb, **env)
    wait_until(lambda: "view" in (fleet.device(agent.device_id)["info"].get("features") or []), 30, "the live view")
    return agent


def events(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a Server-Sent Events response, as they come."""
    kind, data = "message", []
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def first_frame(fleet: Fleet, device_id: str) -> dict[str, Any]:
    """One frame of the device's live view, through the REST API."""
    with fleet.server.client() as c:
        view = c.post(f"/v1/devices/{device_id}/views", json={}).json()
        with c.stream("GET", view["frames_url"], timeout=30) as r:
            assert r.status_code == 200, r.read()
            for kind, data in events(r):
                assert kind == "frame", data
                return data
    raise AssertionError("the view ended without a frame")


def click_at(fleet: Fleet, device_id: str, frame: dict[str, Any], x: int, y: int) -> httpx.Response:
    """A click at screen pixel (x, y), aimed at `frame` as the live view shows it."""
    fx = round(x * frame["width"] / frame["screen_width"])
    fy = round(y * frame["height"] / frame["screen_height"])
    body = {"kind": "click", "x": fx, "y": fy, "frame_width": frame["width"], "frame_height": frame["height"]}
    with fleet.server.client() as c:
        return c.post(f"/v1/devices/{device_id}/input", json=body)


def button_centre(tk_app: TkApp) -> tuple[int, int]:
    x, y, w, h = tk_app.wait_for(lambda s: bool(s.get("widgets")), "the app's layout")["widgets"]["button"]
    return x + w // 2, y + h // 2


def test_a_live_view_in_the_browser_changes_when_the_app_changes(
    tmp_path: Path,
    xvfb: str,
    tk_app: TkApp,
    browser: Any,  # noqa: F811 (the fixture)
) -> None:
    with Fleet(tmp_path) as fleet:
        agent = desktop(fleet, xvfb)
        with watching(browser, fleet) as w:
            page = w.page
            page.goto(f"{fleet.server.url}/#/devices/{agent.device_id}")
            page.fill("#api-key", fleet.server.api_key)
            page.click("form button[type=submit]")
            page.wait_for_selector("header.topbar")
            page.click("#live-watch")
            page.wait_for_selector("#live-image[data-n]")
            before = page.get_attribute("#live-image", "src")
            assert before is not None and before.startswith("data:image/")
            tk_app.wait_for(lambda s: s.get("ready"), "the app")
            subprocess.run(
                ["xdotool", "type", "--delay", "20", "changed"], env={"DISPLAY": xvfb}, check=True, timeout=30
            )
            tk_app.wait_for(lambda s: s.get("entry") == "changed", "the text typed into the app")
            page.wait_for_function(
                "src => document.querySelector('#live-image').src !== src", arg=before, timeout=20_000
            )
            page.click("#live-watch")  # stop watching


def test_a_takeover_mid_agent_node_pauses_it_and_the_handback_makes_the_model_observe_again(
    tmp_path: Path, xvfb: str, tk_app: TkApp, llm: FakeLLM
) -> None:
    seen: dict[str, Any] = {}

    def stale_click(body: dict[str, Any]) -> dict[str, Any]:
        # After the handback: the model is told the person's note, and tries the observation it
        # had before the takeover, which the agent voided.
        seen["after_handback"] = json.dumps(body["messages"])
        return call("gui__click", x=10, y=10, observation_id=seen["first_observation"], action_id="stale-click-01")

    def remember(body: dict[str, Any]) -> dict[str, Any]:
        for message in reversed(body["messages"]):
            found = re.search(r'"observation_id":\s*"([^"]+)"', message.get("content") or "")
            if message.get("role") == "tool" and found:
                seen["first_observation"] = found.group(1)
                break
        return call("approval__ask_person", question="A CAPTCHA: please press the button for me")

    with Fleet(tmp_path, **llm.env()) as fleet:
        agent = desktop(fleet, xvfb, "desktop", "--unattended")
        llm.add(call("gui__observe"), remember, stale_click, call("gui__observe"), call("finish", answer="done"))
        dag = {
            "nodes": [
                {
                    "id": "book",
                    "kind": "agent",
                    "placement": {"labels": {"screen": "yes"}},
                    "instruction": "Press the button, asking a person when you cannot.",
                    "max_steps": 8,
                }
            ]
        }
        task_id = fleet.submit(dag)["id"]
        with fleet.server.client() as c:

            def question() -> dict[str, Any] | None:
                items = c.get("/v1/approvals", params={"state": "pending", "task_id": task_id}).json()["items"]
                return next((a for a in items if a["tool"] == "approval.ask_person"), None)

            wait_until(question, 60, "the model to ask for a person")
            r = c.post(f"/v1/devices/{agent.device_id}/takeover", json={"reason": "a CAPTCHA"})
            assert r.status_code == 200 and r.json()["takeover"]["source"] == "operator", r.text
            wait_until(
                lambda: fleet.node(fleet.task(task_id), "book")["state"] == "taken_over", 30, "the node to pause"
            )
            assert tk_app.state().get("clicks", 0) == 0

            frame = first_frame(fleet, agent.device_id)
            clicked = click_at(fleet, agent.device_id, frame, *button_centre(tk_app))
            assert clicked.status_code == 200, clicked.text
            tk_app.wait_for(lambda s: s.get("clicks", 0) == 1, "the person's click through the live view")

            back = c.post(f"/v1/devices/{agent.device_id}/handback", json={"note": "pressed it for you"})
            assert back.status_code == 200 and back.json()["takeover"] is None, back.text

        done = fleet.wait_task(task_id, timeout=120)
        assert done["state"] == "succeeded", json.dumps(done["nodes"][0])[:3000]
        assert "pressed it for you" in seen["after_handback"]
        # The model's click on the observation from before the takeover was refused, not sent.
        stale = [m for m in llm.requests[3]["messages"] if m.get("role") == "tool"]
        assert "stale_observation" in (stale[-1].get("content") or ""), [m.get("content", "")[:300] for m in stale]
        assert tk_app.state()["clicks"] == 1, "only the person's click reached the app"


def test_a_failed_gui_attempt_leaves_a_recording_the_browser_plays_and_a_successful_one_none(
    tmp_path: Path,
    xvfb: str,
    tk_app: TkApp,
    browser: Any,  # noqa: F811 (the fixture)
) -> None:
    with Fleet(tmp_path) as fleet:
        desktop(fleet, xvfb, "desktop", "--unattended")
        bad = {
            "tool": "gui.click",
            "arguments": {"x": 5, "y": 5, "observation_id": "0" * 32, "action_id": "no-such-obs"},
        }
        failed = fleet.wait_task(
            fleet.submit({"nodes": [{"id": "g", "commands": [bad], "retry": {"max_attempts": 1}}]})["id"], timeout=90
        )
        assert failed["state"] == "failed", failed
        fine = fleet.wait_task(
            fleet.submit({"nodes": [{"id": "g", "commands": [{"tool": "gui.windows"}]}]})["id"], timeout=90
        )
        assert fine["state"] == "succeeded", fine
        with fleet.server.client() as c:

            def recordings(task_id: str) -> list[dict[str, Any]]:
                items = c.get(f"/v1/tasks/{task_id}/artifacts").json()["items"]
                return [a for a in items if str(a.get("content_type", "")).startswith("video/")]

            (kept,) = wait_until(lambda: recordings(failed["id"]), 60, "the failed attempt's recording")
            video = c.get(f"/v1/tasks/{failed['id']}/artifacts/{kept['name']}/content").content
            assert video.startswith(WEBM_MAGIC) and kept["content_type"] == "video/webm"
            assert recordings(fine["id"]) == [], "a successful attempt keeps no recording"
        with watching(browser, fleet) as w:
            page = w.page
            page.goto(f"{fleet.server.url}/")
            duration = page.evaluate(
                """async (b64) => {
                    const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
                    const video = document.createElement("video");
                    video.muted = true;
                    video.src = URL.createObjectURL(new Blob([bytes], { type: "video/webm" }));
                    document.body.append(video);
                    await new Promise((ok, bad) => {
                        video.onloadeddata = ok;
                        video.onerror = () => bad(video.error.message);
                    });
                    return video.videoWidth > 0 ? video.duration || 0.001 : 0;
                }""",
                base64.b64encode(video).decode(),
            )
            assert duration > 0, "the browser could not play the recording"


def test_a_view_of_another_device_is_refused_and_an_owner_may_forbid_watching(tmp_path: Path, xvfb: str) -> None:
    with Fleet(tmp_path) as fleet:
        watched = desktop(fleet, xvfb, "watched")
        private = fleet.agent("private", extra_args=GUI, DISPLAY=xvfb, ORRERY_AGENT_VIEW='{"allow_watching": false}')
        with fleet.server.client() as c:
            view = c.post(f"/v1/devices/{watched.device_id}/views", json={}).json()
            other = c.get(f"/v1/devices/{private.device_id}/views/{view['view_id']}/frames")
            assert other.status_code == 403 and other.json()["code"] == "view_scope", other.text

            mine = c.post(f"/v1/devices/{private.device_id}/views", json={}).json()
            with c.stream("GET", mine["frames_url"], timeout=30) as r:
                assert r.status_code == 200
                kind, data = next(events(r))
            assert (kind, data["code"]) == ("ended", "watch_disallowed"), data
