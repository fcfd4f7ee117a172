"""An agent node's conversation keeps only the newest screenshots as images (older ones become
notes), tells the model the size it sees, and maps its coordinates back to the screenshot's."""

from __future__ import annotations

import base64
import json
from typing import Any

from orchestrator.planner.calls import Call
from orchestrator.planner.context import Context
from orchestrator.planner.screens import Limits
from tests.unit.planner.test_screens import screenshot

SHOT = base64.b64encode(screenshot(1280, 800, noise=False)).decode()


def observed(oid: str, title: str = "Orrery test app") -> dict[str, Any]:
    """A `gui.observe` result as the device's router sends it (structured content plus images)."""
    return {
        "status": "success",
        "result": {
            "observation_id": oid,
            "width": 1280,
            "height": 800,
            "screen_width": 1280,
            "screen_height": 800,
            "focused_window": {"id": 7, "title": title},
            "images": [{"type": "image", "mime_type": "image/png", "data": SHOT}],
        },
        "error": None,
    }


def assistant(name: str, **arguments: Any) -> dict[str, Any]:
    call = {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def images_in(messages: list[dict[str, Any]]) -> list[str]:
    return [
        part["image_url"]["url"]
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "image_url"
    ]


async def test_only_the_newest_screenshots_stay_and_older_ones_become_one_line_notes() -> None:
    context = Context(vision=True, kept=2, limits=Limits(max_side=640))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for n in range(1, 5):
        messages.append(assistant("gui__observe" if n == 1 else "gui__click", x=10 * n, y=5))
        await context.add_results(messages, [Call(f"c{n}", "gui.observe", {})], [observed(f"obs-{n}", f"win {n}")])
    assert len(images_in(messages)) == 2
    texts = [m["content"] for m in messages if isinstance(m.get("content"), str)]
    notes = [t for t in texts if t.startswith("[An earlier screenshot")]
    assert len(notes) == 2
    assert "observation obs-1" in notes[0] and "640x400 pixels (scaled from 1280x800)" in notes[0]
    assert "focused window 'win 1'" in notes[0] and "Next you called gui.click(x=20, y=5)" in notes[0]
    assert "observation obs-2" in notes[1] and "gui.click(x=30, y=5)" in notes[1]
    newest = [m for m in messages if isinstance(m.get("content"), list)]
    assert "observation obs-3" in newest[0]["content"][0]["text"]
    assert "observation obs-4" in newest[1]["content"][0]["text"]
    # The tool result tells the model the size it sees, not the device's.
    shown = json.loads(messages[-2]["content"])["result"]
    assert (shown["width"], shown["height"]) == (640, 400) and shown["coordinate_space"] == "shown_image_pixels"
    assert shown["images"][0]["note"] == "screenshot (shown separately), 640x400 pixels"


async def test_coordinates_the_model_gives_are_mapped_to_the_screenshot_and_checked_in_its_pixels() -> None:
    context = Context(vision=True, kept=1, limits=Limits(max_side=640))
    messages: list[dict[str, Any]] = []
    await context.add_results(messages, [Call("c", "gui.observe", {})], [observed("obs-1")])
    args = {"observation_id": "obs-1", "action_id": "a-12345678", "x": 61, "y": 33, "to_x": 639, "to_y": 399}
    mapped, errors = context.map_calls([Call("k", "gui.drag", args)])
    assert not errors
    assert mapped[0].arguments == {**args, "x": 123, "y": 67, "to_x": 1279, "to_y": 799}
    outside = {"observation_id": "obs-1", "action_id": "a-12345678", "x": 640, "y": 10}
    mapped, errors = context.map_calls([Call("k", "gui.click", outside)])
    assert not mapped and "outside the screenshot you were shown, which is 640x400" in errors[0].message
    # An unknown observation, or one shown at full size, passes as it is (the device decides).
    other = {"observation_id": "elsewhere", "x": 900, "y": 700}
    assert context.map_calls([Call("k", "gui.click", other)])[0][0].arguments == other


async def test_a_text_model_gets_no_images_and_no_mapping() -> None:
    context = Context(vision=False, kept=1, limits=Limits(max_side=640))
    messages: list[dict[str, Any]] = []
    await context.add_results(messages, [Call("c", "gui.observe", {})], [observed("obs-1")])
    assert len(messages) == 1 and not images_in(messages)
    shown = json.loads(messages[0]["content"])["result"]
    assert shown["width"] == 1280 and "not shown" in shown["images"][0]["note"] and "data" not in shown["images"][0]
    args = {"observation_id": "obs-1", "x": 900, "y": 700}
    assert context.map_calls([Call("k", "gui.click", args)])[0][0].arguments == args


async def test_an_image_the_device_left_out_or_that_cannot_be_read_is_said_so() -> None:
    context = Context(vision=True, kept=1, limits=Limits())
    left_out = observed("obs-1")
    left_out["result"]["images"] = [{"type": "image", "mime_type": "image/png", "omitted": "over 3145728 bytes"}]
    messages: list[dict[str, Any]] = []
    await context.add_results(messages, [Call("c", "gui.observe", {})], [left_out])
    assert "over 3145728 bytes" in json.loads(messages[0]["content"])["result"]["images"][0]["note"]
    assert "could not be shown" in messages[1]["content"] and "over 3145728 bytes" in messages[1]["content"]
    broken = observed("obs-2")
    broken["result"]["images"][0]["data"] = base64.b64encode(b"garbage").decode()
    await context.add_results(messages, [Call("c", "gui.observe", {})], [broken])
    assert "cannot be decoded" in messages[-1]["content"]


async def test_of_several_images_in_one_step_only_the_last_is_shown_and_maps_coordinates() -> None:
    context = Context(vision=True, kept=3, limits=Limits(max_side=640))
    messages: list[dict[str, Any]] = []
    actions = [Call("a", "gui.observe", {}), Call("b", "gui.observe", {})]
    await context.add_results(messages, actions, [observed("obs-1"), observed("obs-2")])
    assert [m["role"] for m in messages] == ["tool", "tool", "user"] and len(images_in(messages)) == 1
    first, second = (json.loads(m["content"])["result"] for m in messages[:2])
    assert first["images"][0]["note"] == "screenshot not shown: a newer image of this step is shown instead"
    assert first["width"] == 1280 and second["width"] == 640 and set(context.frames) == {"obs-2"}
    assert "observation obs-2" in messages[2]["content"][0]["text"]


async def test_an_image_no_observation_names_says_how_it_was_scaled() -> None:
    context = Context(vision=True, kept=1, limits=Limits(max_side=640))
    plain = {"status": "success", "result": [{"type": "image", "mime_type": "image/png", "data": SHOT}]}
    messages: list[dict[str, Any]] = []
    await context.add_results(messages, [Call("a", "web.screenshot", {})], [plain])
    text = messages[-1]["content"][0]["text"]
    assert "a tool's image, 640x400 pixels (scaled from 1280x800)" in text and "x times 2 and y times 2" in text
