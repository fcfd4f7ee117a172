"""Accessibility-grounded GUI (issue 19): the AT-SPI element tree of a real GTK app on Xvfb, with a
real session D-Bus and AT-SPI bus, and inputs aimed at elements (click, type, set_value) verified
through the app's own state file. Everything goes through a real MCP client on the `gui` toolset.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import ImageContent

from device_agent.toolsets.gui import atspi, marks
from tests.gui.conftest import TkApp
from tests.gui.fakes import code, data
from tests.gui.test_x11 import gui

WINDOW = "Orrery GTK app"


async def observe(client: Client) -> dict[str, Any]:
    result = await client.call_tool("observe", {})
    assert not result.is_error, result.content
    return data(result)


def element(obs: dict[str, Any], name: str) -> dict[str, Any]:
    tree = obs["accessibility"]
    assert tree["available"], tree
    found = [e for e in tree["elements"] if e["name"] == name]
    assert len(found) == 1, [(e["id"], e["role"], e["name"]) for e in tree["elements"]]
    return found[0]


def on(obs: dict[str, Any], action_id: str, name: str, **more: Any) -> dict[str, Any]:
    """Arguments of an input on the element called `name` of observation `obs`."""
    target = element(obs, name)
    return {
        "observation_id": obs["observation_id"],
        "action_id": action_id,
        "element_id": target["id"],
        "name": name,
    } | more


async def test_observe_lists_the_focused_apps_elements_and_marks_them(
    xvfb: str, gtk_app: TkApp, tmp_path: Path
) -> None:
    async with gui(xvfb, tmp_path) as client:
        result = await client.call_tool("observe", {})
        assert not result.is_error, result.content
        obs = data(result)
        tree = obs["accessibility"]
        assert tree["available"] and tree["window"] == WINDOW and tree["truncated"] is False
        roles = {e["name"]: e["role"] for e in tree["elements"]}
        assert roles["Press me"] == "push button" and roles["Name"] == "text"
        assert roles["Subscribe"] == "check box" and roles["Volume"] == "slider" and roles["Locked"] == "push button"
        press, locked, volume = element(obs, "Press me"), element(obs, "Locked"), element(obs, "Volume")
        assert "enabled" in press["states"] and "visible" in press["states"] and "showing" in press["states"]
        assert "enabled" not in locked["states"]
        assert "editable" in element(obs, "Name")["states"]
        assert volume["value"] == 10.0
        x, y, w, h = press["bounds"]
        assert w > 0 and h > 0 and 0 <= x < 480 and 0 <= y < 360  # the window sits at 0,0
        ids = [e["id"] for e in tree["elements"]]
        assert ids == list(range(1, len(ids) + 1))
        # Two images: the plain screenshot, then the set-of-marks one with the boxes drawn on it.
        assert obs["marked_screenshot"] is True
        plain, marked = result.content[0], result.content[1]
        assert isinstance(plain, ImageContent) and isinstance(marked, ImageContent)
        assert plain.data != marked.data
        pixels = _pixels(base64.b64decode(marked.data))
        assert pixels[(y + 1, x + w // 2)] == marks.BOX  # the box's top edge over the button
        assert _pixels(base64.b64decode(plain.data))[(y + 1, x + w // 2)] != marks.BOX


def test_the_tree_is_bounded_and_says_so(gtk_app: TkApp) -> None:
    small = atspi.snapshot(WINDOW, max_elements=3)
    assert len(small.elements) == 3
    assert small.describe()["truncated"] is True and "3 elements" in small.describe()["truncation"]
    shallow = atspi.snapshot(WINDOW, max_depth=0)
    assert [e.role for e in shallow.elements] == ["frame"] and "depth 0" in str(shallow.truncated)
    full = atspi.snapshot(WINDOW)
    assert full.truncated is None and len(full.elements) >= 6


async def test_click_by_element_presses_the_button_through_its_action(
    xvfb: str, gtk_app: TkApp, tmp_path: Path
) -> None:
    async with gui(xvfb, tmp_path) as client:
        obs = await observe(client)
        result = await client.call_tool("click", on(obs, "press-by-id-1", "Press me"))
        assert not result.is_error, data(result)
        receipt = data(result)
        assert receipt["element_id"] == element(obs, "Press me")["id"]
        assert receipt["route"] == "accessibility action 'click'"
        assert isinstance(receipt["outcome_verified"], bool) and receipt["verification"]
        gtk_app.wait_for(lambda s: s["clicks"] == 1, "the button press")

        # A check box through its action: the toggle is verified from its states.
        obs = receipt["observation"]
        result = await client.call_tool("click", on(obs, "tick-the-box-1", "Subscribe"))
        receipt = data(result)
        assert not result.is_error and receipt["outcome_verified"] is True, receipt
        assert "+checked" in receipt["verification"]
        gtk_app.wait_for(lambda s: s["subscribed"] is True, "the check box to be ticked")


async def test_an_element_without_a_matching_action_is_clicked_by_pointer(
    xvfb: str, gtk_app: TkApp, tmp_path: Path
) -> None:
    """A double click has no accessibility action: it goes to the centre of the element's bounds."""
    async with gui(xvfb, tmp_path) as client:
        obs = await observe(client)
        result = await client.call_tool("double_click", on(obs, "double-press-1", "Press me"))
        receipt = data(result)
        assert not result.is_error and receipt["route"] == "pointer at the element's centre", receipt
        gtk_app.wait_for(lambda s: s["clicks"] == 2, "two presses from the double click")
        # Typing into something that is not editable: a click on it, then the keys (by pointer).
        obs = receipt["observation"]
        result = await client.call_tool("type", on(obs, "type-in-box-1", "Subscribe", text="x"))
        receipt = data(result)
        assert not result.is_error and receipt["route"] == "pointer click on the element, then typed", receipt
        gtk_app.wait_for(lambda s: s["subscribed"] is True and s["focus"] == "check", "the pointer click on the box")
        assert receipt["outcome_verified"] is True and "+checked" in receipt["verification"], receipt


async def test_type_and_set_value_by_element_are_verified(xvfb: str, gtk_app: TkApp, tmp_path: Path) -> None:
    async with gui(xvfb, tmp_path) as client:
        obs = await observe(client)
        result = await client.call_tool("type", on(obs, "type-name-001", "Name", text="Ada"))
        receipt = data(result)
        assert not result.is_error and receipt["outcome_verified"] is True, receipt
        assert "EditableText" in receipt["route"] and "contains the typed text" in receipt["verification"]
        gtk_app.wait_for(lambda s: s["entry"] == "Ada", "the typed text")

        obs = receipt["observation"]
        assert element(obs, "Name")["text"] == "Ada"
        result = await client.call_tool("set_value", on(obs, "set-name-0001", "Name", value="Grace Hopper"))
        receipt = data(result)
        assert not result.is_error and receipt["outcome_verified"] is True, receipt
        gtk_app.wait_for(lambda s: s["entry"] == "Grace Hopper", "the replaced text")

        obs = receipt["observation"]
        result = await client.call_tool("set_value", on(obs, "set-volume-01", "Volume", value=72))
        receipt = data(result)
        assert not result.is_error and receipt["route"] == "accessibility Value", receipt
        assert receipt["outcome_verified"] is True and "72" in receipt["verification"]
        gtk_app.wait_for(lambda s: s["volume"] == 72.0, "the slider's new value")

        # A slider takes a number: a word is refused before anything is done.
        obs = receipt["observation"]
        result = await client.call_tool("set_value", on(obs, "set-volume-02", "Volume", value="loud"))
        assert code(result) == "invalid_arguments" and "number" in data(result)["message"]
        assert gtk_app.state()["volume"] == 72.0


async def test_refusals_name_mismatch_stale_id_and_disabled(xvfb: str, gtk_app: TkApp, tmp_path: Path) -> None:
    async with gui(xvfb, tmp_path) as client:
        obs = await observe(client)
        press = element(obs, "Press me")
        wrong = {"observation_id": obs["observation_id"], "action_id": "mismatch-001", "element_id": press["id"]}
        result = await client.call_tool("click", wrong | {"name": "Delete everything"})
        assert code(result) == "element_mismatch", data(result)
        assert "'Press me'" in data(result)["message"] and "nothing was done" in data(result)["message"]

        # A refusal before the input leaves the observation usable; the disabled button is refused.
        result = await client.call_tool("click", on(obs, "locked-0001", "Locked"))
        assert code(result) == "element_not_actionable" and "disabled" in data(result)["message"], data(result)

        # An element id of an older observation: stale, like its observation.
        newer = await observe(client)
        stale = on(obs, "stale-0001", "Press me")
        result = await client.call_tool("click", stale)
        assert code(result) == "stale_observation", data(result)
        # An element id without its name, unknown ids and mixed targets are argument errors.
        nameless = {k: v for k, v in on(newer, "nameless-01", "Press me").items() if k != "name"}
        result = await client.call_tool("click", nameless)
        assert code(result) == "invalid_arguments" and "name too" in data(result)["message"]
        newer = await observe(client)
        result = await client.call_tool("click", on(newer, "unknown-01", "Press me") | {"element_id": 999})
        assert code(result) == "invalid_arguments" and "not in observation" in data(result)["message"]
        newer = await observe(client)
        result = await client.call_tool("click", on(newer, "mixed-0001", "Press me") | {"x": 5, "y": 5})
        assert code(result) == "invalid_arguments"
        state = gtk_app.state()
        assert state["clicks"] == 0 and state["locked_clicks"] == 0


async def test_an_element_renamed_since_the_observation_is_stale(xvfb: str, gtk_app: TkApp, tmp_path: Path) -> None:
    """The observation lists the entry by its name; the app renames it before the input runs."""
    async with gui(xvfb, tmp_path) as client:
        obs = await observe(client)
        args = on(obs, "renamed-001", "Subscribe")
        gtk_app_rename(gtk_app, "Subscribe to news")
        gtk_app.wait_for(lambda s: s.get("renamed"), "the app to rename its check box")
        result = await client.call_tool("click", args)
        assert code(result) == "stale_observation" and "now named" in data(result)["message"], data(result)
        assert gtk_app.state()["subscribed"] is False


def gtk_app_rename(app: TkApp, label: str) -> None:
    """Ask the GTK app (through its control file) to relabel its check box."""
    app.state_file.with_suffix(".rename").write_text(label)


def _pixels(png: bytes) -> dict[tuple[int, int], bytes]:
    """A lazy pixel lookup (row, column) -> RGB of one of our PNGs."""
    decoded = marks.decode(png)
    assert decoded is not None
    width, _, rows = decoded
    stride = 1 + 3 * width

    class Lookup(dict[tuple[int, int], bytes]):
        def __missing__(self, key: tuple[int, int]) -> bytes:
            row, col = key
            start = row * stride + 1 + 3 * col
            return bytes(rows[start : start + 3])

    return Lookup()


async def test_an_app_without_an_accessibility_bridge_gets_a_reason_not_an_error(
    xvfb: str, a11y_bus: dict[str, str], tk_app: TkApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tk does not join the AT-SPI bus: the observation still works and says to use coordinates."""
    for name, value in a11y_bus.items():
        monkeypatch.setenv(name, value)
    async with gui(xvfb, tmp_path) as client:
        result = await client.call_tool("observe", {})
        obs = data(result)
        assert obs["focused_window"]["title"] == "Orrery test app"
        tree = obs["accessibility"]
        assert tree["available"] is True and tree["elements"] == [], tree
        assert "'Orrery test app'" in tree["reason"] and "use coordinates" in tree["reason"]
        assert obs["marked_screenshot"] is False and len(result.content) == 2  # one image, then the JSON
        args = {"observation_id": obs["observation_id"], "action_id": "no-elements-1", "element_id": 1, "name": "x"}
        refused = await client.call_tool("click", args)
        assert code(refused) == "invalid_arguments" and "no accessible elements" in data(refused)["message"]
