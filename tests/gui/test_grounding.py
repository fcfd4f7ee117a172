"""Pure rules of element inputs and set-of-marks: picking an element, refusing a changed or
disabled one, choosing the route, reading back what changed; drawing marks on our own PNGs."""

from __future__ import annotations

import zlib

import mss.tools
import pytest

from device_agent.toolsets.gui.atspi import Element, Live
from device_agent.toolsets.gui.grounding import ElementAct, check_live, pick, plan_for, verify
from device_agent.toolsets.gui.marks import BOX, decode, draw
from device_agent.toolsets.gui.rules import GuiError

SHOWN = frozenset({"enabled", "sensitive", "visible", "showing"})
SLIDER = Element(5, ":1.0", "/a/5", "slider", "Volume", SHOWN, (10, 20, 100, 30), frozenset({"Component", "Value"}))
BUTTON = Element(
    2, ":1.0", "/a/2", "push button", "Save", SHOWN, (0, 0, 40, 20), frozenset({"Component", "Action"}), ("click",)
)


def live(element: Element, **changes: object) -> Live:
    base = {"name": element.name, "states": element.states, "bounds": element.bounds, "value": None, "text": None}
    return Live(**(base | changes))  # type: ignore[arg-type]


def test_pick_checks_the_id_and_the_name() -> None:
    elements = {2: BUTTON, 5: SLIDER}
    assert pick(elements, 5, "Volume", "obs1") is SLIDER
    with pytest.raises(GuiError) as wrong:
        pick(elements, 2, "Delete", "obs1")
    assert wrong.value.code == "element_mismatch" and "'Save'" in wrong.value.message
    with pytest.raises(GuiError) as unknown:
        pick(elements, 9, "Save", "obs1")
    assert unknown.value.code == "invalid_arguments" and "1..5" in unknown.value.message


def test_a_changed_disabled_or_hidden_element_is_refused() -> None:
    act = ElementAct("click", BUTTON)
    check_live(act, live(BUTTON))
    cases = [
        (live(BUTTON, name="Save as"), "stale_observation"),
        (live(BUTTON, states=SHOWN - {"sensitive"}), "element_not_actionable"),
        (live(BUTTON, states=SHOWN - {"showing"}), "element_not_actionable"),
        (live(BUTTON, bounds=(0, 0, 0, 0)), "element_not_actionable"),
    ]
    for state, code in cases:
        with pytest.raises(GuiError) as refused:
            check_live(act, state)
        assert refused.value.code == code


def test_routes_prefer_the_elements_own_interface() -> None:
    assert plan_for(ElementAct("click", BUTTON), live(BUTTON)) == ("accessibility action 'click'", ())
    route, gestures = plan_for(ElementAct("click", BUTTON, button=3), live(BUTTON))
    assert route == "pointer at the element's centre" and gestures[0].points == ((20, 10),) and gestures[0].button == 3
    assert plan_for(ElementAct("set_value", SLIDER, value=3), live(SLIDER))[0] == "accessibility Value"
    with pytest.raises(GuiError):
        plan_for(ElementAct("set_value", SLIDER, value="nan"), live(SLIDER))
    with pytest.raises(GuiError) as no_value:
        plan_for(ElementAct("set_value", BUTTON, value=3), live(BUTTON))
    assert "gui.click or gui.type" in no_value.value.message


def test_verification_says_what_was_seen() -> None:
    act = ElementAct("set_value", SLIDER, value=40)
    assert verify(act, live(SLIDER, value=10.0), live(SLIDER, value=40.0), False, True) == (
        True,
        "the element's value is now 40",
    )
    ok, seen = verify(act, live(SLIDER, value=10.0), live(SLIDER, value=10.0), False, False)
    assert not ok and "not the requested 40" in seen
    ok, seen = verify(ElementAct("click", BUTTON), live(BUTTON), live(BUTTON), False, False)
    assert not ok and "no change was visible" in seen
    assert verify(ElementAct("click", BUTTON), live(BUTTON), live(BUTTON), True, True)[0] is True
    assert verify(ElementAct("click", BUTTON), live(BUTTON), None, False, False)[0] is False


def test_marks_are_drawn_on_our_pngs_and_other_pngs_are_left_alone() -> None:
    png = mss.tools.to_png(bytes(3 * 64 * 48), (64, 48))
    assert png is not None
    marked = draw(png, [(7, (10, 10, 30, 20))])
    assert marked is not None and marked != png
    decoded = decode(marked)
    assert decoded is not None
    width, height, rows = decoded
    stride = 1 + 3 * width
    assert (width, height) == (64, 48)
    assert bytes(rows[10 * stride + 1 + 3 * 25 : 10 * stride + 1 + 3 * 26]) == BOX  # the box's top edge
    assert draw(png, [(1, (0, 0, 0, 0))]) is None  # nothing to mark
    # A filtered row (filter type 1) is not one of ours: no marks rather than garbage.
    raw = b"\x01" + bytes(3 * 4)
    other = png[:8] + _chunk(b"IHDR", (4).to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes([8, 2, 0, 0, 0]))
    other += _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")
    assert decode(other) is None and draw(other, [(1, (0, 0, 2, 1))]) is None


def _chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + (zlib.crc32(kind + body) & 0xFFFFFFFF).to_bytes(4, "big")
