"""Inputs aimed at an accessible element (`element_id`) instead of a pixel.

An element comes from the current observation's tree (see `atspi`); the caller also names it,
and a different name is refused (`element_mismatch`), as is an element that is now disabled or
not visible (`element_not_actionable`) or whose name changed since the observation
(`stale_observation`). The input goes through the element's own interface when it has one
(AT-SPI `Action` for a click, `EditableText` for typing, `Value` for a value) and by pointer at
the centre of its bounds otherwise. Afterwards the element is read again and the receipt says
what was verified: the value or text changed, its states changed, it is focused, or the window
changed; or that nothing observable changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import anyio.to_thread

from device_agent.toolsets.gui.atspi import Bus, Element, Live, Tree, click_action, connect, snapshot
from device_agent.toolsets.gui.rules import Gesture, GuiError


@dataclass(frozen=True)
class ElementAct:
    """One input on an element of the observation."""

    tool: str  # click | double_click | type | set_value
    element: Element
    text: str = ""
    value: str | float | None = None
    button: int = 1


@dataclass
class Plan:
    """How an element input is carried out: by the element's interface, or by these pointer gestures."""

    route: str
    before: Live
    gestures: tuple[Gesture, ...] = ()


class Accessibility(Protocol):
    """What the controller needs from the accessibility layer (AT-SPI, or nothing)."""

    async def snapshot(self, window_title: str) -> Tree: ...
    async def prepare(self, act: ElementAct) -> Plan: ...
    async def perform(self, act: ElementAct, plan: Plan) -> None: ...
    async def live(self, element: Element) -> Live | None: ...


def pick(elements: dict[int, Element], element_id: int, name: str | None, observation_id: str) -> Element:
    """The element `element_id` of the observation, cross-checked against the `name` the caller gave."""
    element = elements.get(element_id)
    if element is None:
        listed = f"1..{max(elements)}" if elements else "none: the observation has no accessible elements"
        raise GuiError(
            "invalid_arguments",
            f"element_id {element_id} is not in observation {observation_id} (its elements: {listed}); element "
            "ids are valid only for the observation that listed them: use one from the latest observation",
        )
    if name is not None and name.strip() != element.name.strip():
        raise GuiError(
            "element_mismatch",
            f"element {element_id} of observation {observation_id} is the {element.role} named "
            f"{element.name[:80]!r}, not {name[:80]!r}; nothing was done. Look up the element by its name in "
            "the latest observation's elements and pass that id",
            element={"id": element_id, "role": element.role, "name": element.name},
        )
    return element


def check_live(act: ElementAct, live: Live) -> None:
    """Refuse an element that changed, or that is disabled or not visible now."""
    element = act.element
    if live.name != element.name:
        raise GuiError(
            "stale_observation",
            f"element {element.id} was named {element.name[:80]!r} when observed and is now named "
            f"{live.name[:80]!r}; call gui.observe and act on the new elements",
        )
    states, (_, _, w, h) = live.states, live.bounds
    if "enabled" not in states or "sensitive" not in states:
        raise GuiError(
            "element_not_actionable",
            f"element {element.id} ({element.role} {element.name[:80]!r}) is disabled; nothing was done. Do what "
            "enables it first (the application decides), or pick another element",
        )
    if "visible" not in states or "showing" not in states or w <= 0 or h <= 0:
        raise GuiError(
            "element_not_actionable",
            f"element {element.id} ({element.role} {element.name[:80]!r}) is not visible on screen; nothing was "
            "done. Scroll or open what shows it, observe again, then act",
        )


def _number(value: str | float | None) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise GuiError(
            "invalid_arguments", f"this element takes a number as its value, not {str(value)[:40]!r}"
        ) from None
    if not math.isfinite(number):
        raise GuiError("invalid_arguments", "the value must be a finite number")
    return number


def plan_for(act: ElementAct, live: Live) -> tuple[str, tuple[Gesture, ...]]:
    """The route for `act` on an element with this state: an interface name, or pointer gestures."""
    element = act.element
    x, y, w, h = live.bounds
    centre = (x + w // 2, y + h // 2)
    pointer = Gesture("click", (centre,), act.button, count=2 if act.tool == "double_click" else 1)
    if act.tool == "click" and act.button == 1 and click_action(element) is not None:
        index = click_action(element)
        return f"accessibility action {element.actions[index or 0]!r}", ()
    if act.tool in ("click", "double_click"):
        return "pointer at the element's centre", (pointer,)
    if act.tool == "type":
        if "EditableText" in element.interfaces and "editable" in live.states:
            return "accessibility EditableText (inserted at the caret)", ()
        return "pointer click on the element, then typed", (pointer, Gesture("type", text=act.text))
    if act.tool == "set_value":
        if "Value" in element.interfaces:
            _number(act.value)
            return "accessibility Value", ()
        if "EditableText" in element.interfaces and "editable" in live.states:
            return "accessibility EditableText (contents replaced)", ()
        raise GuiError(
            "invalid_arguments",
            f"element {element.id} ({element.role} {element.name[:80]!r}) has no value and no editable text; "
            "use gui.click or gui.type on it instead",
        )
    raise GuiError("invalid_arguments", f"{act.tool} cannot act on an element")


def verify(
    act: ElementAct, before: Live, after: Live | None, window_changed: bool, screen_changed: bool
) -> tuple[bool, str]:
    """(verified, what was seen) after an element input."""
    seen: list[str] = []
    if after is not None:
        if act.tool == "set_value" and after.value is not None:
            if math.isclose(after.value, _number(act.value), abs_tol=1e-6):
                return True, f"the element's value is now {after.value:g}"
            seen.append(f"the value is {after.value:g}, not the requested {act.value}")
        elif act.tool == "set_value" and after.text is not None:
            if after.text == str(act.value):
                return True, "the element's text is now the requested value"
            seen.append("the element's text differs from the requested value")
        if act.tool == "type" and after.text is not None and before.text is not None:
            if act.text in after.text and after.text != before.text:
                return True, "the element's text now contains the typed text"
            seen.append("the element's text does not contain the typed text")
        gained, lost = sorted(after.states - before.states), sorted(before.states - after.states)
        if gained or lost:
            change = ", ".join([*(f"+{s}" for s in gained), *(f"-{s}" for s in lost)])
            if not seen:
                return True, f"the element's states changed ({change})"
            seen.append(f"its states changed ({change})")
        if after.value != before.value and act.tool != "set_value":
            return True, f"the element's value changed to {after.value}"
    else:
        seen.append("the element is gone after the input")
    if window_changed:
        return True, "; ".join([*seen, "the focused window changed"])
    if screen_changed:
        return not seen, "; ".join([*seen, "the screen changed"])
    return False, "; ".join([*seen, "no change was visible in the element, the focused window or the screen"])


class AtspiAccessibility:
    """The AT-SPI implementation; each call opens its own short connection in a worker thread."""

    async def snapshot(self, window_title: str) -> Tree:
        return await anyio.to_thread.run_sync(snapshot, window_title)

    async def prepare(self, act: ElementAct) -> Plan:
        def run() -> Plan:
            with connect() as bus:
                live = bus.live(act.element)
            check_live(act, live)
            route, gestures = plan_for(act, live)
            return Plan(route, live, gestures)

        return await anyio.to_thread.run_sync(run)

    async def perform(self, act: ElementAct, plan: Plan) -> None:
        if plan.gestures:
            return  # the controller sends the pointer gestures

        def run() -> None:
            with connect() as bus:
                _perform(bus, act, plan)

        await anyio.to_thread.run_sync(run)

    async def live(self, element: Element) -> Live | None:
        def run() -> Live | None:
            try:
                with connect() as bus:
                    return bus.live(element)
            except GuiError:
                return None

        return await anyio.to_thread.run_sync(run)


def _perform(bus: Bus, act: ElementAct, plan: Plan) -> None:
    element, b, p = act.element, act.element.bus, act.element.path
    ok: Any
    if plan.route.startswith("accessibility action"):
        ok = bus.call(b, p, "Action", "DoAction", "i", click_action(element) or 0)
    elif act.tool == "type":
        if "focused" not in plan.before.states and "Component" in element.interfaces:
            bus.call(b, p, "Component", "GrabFocus")
        caret = int(bus.prop(b, p, "Text", "CaretOffset")) if "Text" in element.interfaces else -1
        caret = len(plan.before.text or "") if caret < 0 else caret
        ok = bus.call(b, p, "EditableText", "InsertText", "isi", caret, act.text, len(act.text))
    elif plan.route == "accessibility Value":
        bus.set_prop(b, p, "Value", "CurrentValue", "d", _number(act.value))
        ok = True
    else:
        ok = bus.call(b, p, "EditableText", "SetTextContents", "s", str(act.value))
    if not ok:
        raise GuiError("tool_error", f"the application refused the input on element {element.id} ({plan.route})")
