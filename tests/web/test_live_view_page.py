"""The device page's live view in a real browser against a real server and a raw protocol device
that streams its screen (tests/screendevice.py, run on its own event loop in a thread): the image
changes as frames come, the rate and the marks show, "Stop watching" stops the device's stream,
a refused watch is said in words, and clicks on the image of a taken-over device reach the
device in the image's own pixels."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.screendevice import ScreenDevice
from tests.support import Fleet, wait_until
from tests.web.conftest import Watched, shot
from tests.web.test_dashboard import node_sel, sign_in


@contextmanager
def screen(fleet: Fleet, name: str, **kw: Any) -> Iterator[ScreenDevice]:
    """A screen device connected for the block, its loop on a thread of its own."""
    enrolled = fleet.enroll(name)
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def run() -> None:
        box["stop"] = asyncio.Event()
        async with ScreenDevice(fleet.server.url, enrolled["id"], enrolled["token"], **kw) as device:
            box["device"], box["loop"] = device, asyncio.get_running_loop()
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
    thread.start()
    assert ready.wait(30), "the screen device did not connect"
    fleet.wait_device(enrolled["id"], "idle")
    try:
        yield box["device"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)


@pytest.fixture(scope="module")
def web_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """This module's own fleet: a server, and screen devices made by each test."""
    with Fleet(tmp_path_factory.mktemp("web-live")) as f:
        yield f


def image_n(page: Any) -> int:
    return int(page.get_attribute("#live-image", "data-n") or 0)


def test_the_live_image_changes_as_frames_come_and_stops_when_the_operator_stops_watching(
    web_fleet: Fleet, watched: Watched
) -> None:
    with screen(web_fleet, "screen-live") as device:
        page = sign_in(watched, web_fleet, hash_=f"#/devices/{device.device_id}")
        page.click("#live-watch")
        page.wait_for_selector("#live-image[data-n]")
        first = (image_n(page), page.get_attribute("#live-image", "src"))
        page.wait_for_function("n => Number(document.querySelector('#live-image').dataset.n) > n", arg=first[0])
        assert page.get_attribute("#live-image", "src") != first[1]  # each frame is another colour
        assert first[1].startswith("data:image/png;base64,")
        page.wait_for_function("() => /fps$/.test(document.querySelector('#live-fps').textContent)")
        assert page.inner_text("#live-status") == "Live."

        page.check("#live-marks-toggle")
        page.wait_for_selector("#live-marks .live-mark")
        assert page.get_attribute("#live-marks .live-mark", "title") == "OK button"
        wait_until(lambda: any(v["on"] and v["marks"] for v in device.views), 15, "a view asking for marks")
        shot(page, "device-live-view")

        page.click("#live-watch")  # Stop watching
        assert page.inner_text("#live-watch") == "Watch"
        wait_until(lambda: not device.views[-1]["on"], 15, "the device told to stop streaming")


def test_a_watch_the_owner_refuses_is_said_in_words(web_fleet: Fleet, watched: Watched) -> None:
    with screen(web_fleet, "screen-private", refuse_watch="watch_disallowed") as device:
        page = sign_in(watched, web_fleet, hash_=f"#/devices/{device.device_id}")
        page.click("#live-watch")
        page.wait_for_function("() => /owner/.test(document.querySelector('#live-status').textContent)")
        assert "does not allow watching" in page.inner_text("#live-status")
        assert page.inner_text("#live-watch") == "Watch"


def test_a_device_without_live_views_says_so(web_fleet: Fleet, watched: Watched) -> None:
    with screen(web_fleet, "screen-old", features=()) as device:
        page = sign_in(watched, web_fleet, hash_=f"#/devices/{device.device_id}")
        page.click("#live-watch")
        page.wait_for_function("() => /cannot stream/.test(document.querySelector('#live-status').textContent)")


def test_an_operator_takes_a_device_over_drives_it_through_the_image_and_hands_it_back(
    web_fleet: Fleet, watched: Watched
) -> None:
    with screen(web_fleet, "screen-drive") as device:
        page = sign_in(watched, web_fleet, hash_=f"#/devices/{device.device_id}")
        page.click("#take-over")  # a reason is asked for first
        page.wait_for_selector("#takeover-reason:focus")
        page.fill("#takeover-reason", "fix the dialog")
        page.click("#take-over")
        page.wait_for_selector("#device-taken-over")
        assert "fix the dialog" in page.inner_text("#device-taken-over")
        assert "[object" not in page.inner_text("#device-taken-over")  # the time is words, not an element's name
        assert page.is_visible("#hand-back") and not page.is_visible("#take-over")
        wait_until(lambda: any(f["control"].get("taken_over") for f in device.controls), 15, "the device told")

        page.click("#live-watch")
        page.wait_for_selector("#live-image[data-n]")
        box = page.locator("#live-image").bounding_box()
        # The 8x6 frame is shown larger: a click at 0.78 of its width, 0.55 of its height is pixel (6, 3).
        page.mouse.click(box["x"] + box["width"] * 0.78, box["y"] + box["height"] * 0.55)
        wait_until(lambda: device.inputs, 15, "the click to reach the device")
        sent = device.inputs[0]
        assert {k: sent[k] for k in ("kind", "x", "y", "frame_width", "frame_height")} == {
            "kind": "click",
            "x": 6,
            "y": 3,
            "frame_width": 8,
            "frame_height": 6,
        }
        assert "key" in sent["by"]  # the operator's key, for the device's audit
        page.wait_for_function(
            "() => /Sent: click at 6, 3/.test(document.querySelector('#live-input-status').textContent)"
        )

        device.input_answer = (False, "not_taken_over")
        page.fill("#live-text", "hello")
        page.click("#live-send-text")
        page.wait_for_selector("#live-input-code")
        assert page.inner_text("#live-input-code") == "not_taken_over"
        assert device.inputs[-1]["text"] == "hello"
        shot(page, "device-taken-over")

        page.fill("#handback-note", "closed the dialog")
        page.click("#hand-back")
        page.wait_for_selector("#take-over")
        assert not page.is_visible("#device-taken-over") and not page.is_visible("#live-drive")
        with web_fleet.server.client() as c:
            devices = c.get("/v1/devices").json()["items"]
        assert next(d for d in devices if d["id"] == device.device_id)["takeover"] is None


def publish(fleet: Fleet, device: ScreenDevice, name: str, data: bytes) -> dict[str, Any]:
    """Publish `data` as an artifact of the device's running batch, as its agent does."""
    body = {"batch_id": device.batches[0]["batch_id"], "name": name, "size": len(data)}
    body["sha256"] = hashlib.sha256(data).hexdigest()
    auth = {"Authorization": f"Bearer {device.token}"}
    with httpx.Client(base_url=fleet.server.url, headers=auth, timeout=30) as c:
        opened = c.post("/v1/agent/artifacts/uploads", json=body)
        assert opened.status_code == 201, opened.text
        sent = c.patch(
            f"/v1/agent/artifacts/uploads/{opened.json()['id']}", content=data, headers={"Upload-Offset": "0"}
        )
        assert sent.status_code == 200, sent.text
        answer: dict[str, Any] = sent.json()
        return answer


GUI_TOOL = {
    "name": "gui.observe",
    "namespace": "gui",
    "annotations": {"read_only": True},
    "tool_type": "data_collection",
}


def test_a_running_nodes_panel_shows_its_devices_screen_live(web_fleet: Fleet, watched: Watched) -> None:
    with screen(web_fleet, "screen-busy", tools=[GUI_TOOL]) as device:
        node = {"id": "look", "placement": {"device": "screen-busy"}, "commands": [{"tool": "gui.observe"}]}
        task = web_fleet.submit({"nodes": [node]}, name="watch-the-node")
        wait_until(lambda: device.batches, 30, "the batch to reach the device")
        recorded = publish(web_fleet, device, "recording-1.webm", b"\x1aE\xdf\xa3 a screen recording")
        page = sign_in(watched, web_fleet, hash_=f"#/tasks/{task['id']}")
        page.click(node_sel("look", "running"))
        page.wait_for_selector("#node-live-image[data-n]")
        # The attempt's recording plays from a blob: URL fetched with the key (never in a URL).
        video = page.wait_for_selector("#node-recordings video[data-artifact='recording-1.webm'][src^='blob:']")
        assert video.evaluate("v => v.controls") is True
        assert recorded["state"] == "complete" or recorded.get("artifact")
        n = int(page.get_attribute("#node-live-image", "data-n") or 0)
        page.wait_for_function("n => Number(document.querySelector('#node-live-image').dataset.n) > n", arg=n)
        shot(page, "node-live-view")
        page.click("#node-panel button[aria-label=Close]")
        wait_until(lambda: not device.views[-1]["on"], 15, "the device told to stop when the panel closed")
