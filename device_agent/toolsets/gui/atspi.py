"""The accessibility tree of the focused application, read and acted on over AT-SPI (D-Bus).

AT-SPI is a D-Bus protocol: `org.a11y.Bus.GetAddress` on the session bus names the
accessibility bus (or `$AT_SPI_BUS_ADDRESS` does); there, the registry's root lists the
applications, and every element is an object with the `org.a11y.atspi.Accessible` interface
(role, name, state, children) plus `Component` (screen bounds, focus), `Action`, `EditableText`,
`Text` and `Value` where it offers them. We speak it with jeepney (pure Python, blocking calls
run in worker threads), so the agent needs no PyGObject build.

The tree is bounded: at most `MAX_ELEMENTS` elements and `MAX_DEPTH` levels, within
`SNAPSHOT_BUDGET_S`; a cut tree says so (`truncated`). Subtrees that are not showing on screen
are skipped, and nameless containers (fillers, panels) are walked through but not listed.
Nothing here fails an observation: without an accessibility bus the result says why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from device_agent.toolsets.gui.rules import GuiError

MAX_ELEMENTS = 150
MAX_DEPTH = 16
SNAPSHOT_BUDGET_S = 5.0
CALL_TIMEOUT_S = 2.0
ACC = "org.a11y.atspi.Accessible"
ROOT_PATH = "/org/a11y/atspi/accessible/root"
REGISTRY = "org.a11y.atspi.Registry"

# AT-SPI StateType numbers (atspi-constants.h) of the states we report.
STATE_BITS = {
    "active": 1,
    "checked": 4,
    "editable": 7,
    "enabled": 8,
    "expanded": 10,
    "focusable": 11,
    "focused": 12,
    "pressed": 20,
    "selected": 23,
    "sensitive": 24,
    "showing": 25,
    "visible": 30,
}
# Roles listed even without a name: they are what a user acts on.
INTERACTIVE_INTERFACES = ("Action", "EditableText", "Value")
# Action names preferred for a click, in order (GTK: "click"; Qt: "Press"; check boxes: "toggle").
CLICK_ACTIONS = ("click", "press", "activate", "toggle", "jump", "open")
SECRET_ROLES = {"password text"}


@dataclass(frozen=True)
class Element:
    """One accessible element of an observation; `id` is only valid for that observation."""

    id: int
    bus: str
    path: str
    role: str
    name: str
    states: frozenset[str]
    bounds: tuple[int, int, int, int]  # x, y, width, height in screen (device) pixels
    interfaces: frozenset[str]
    actions: tuple[str, ...] = ()
    parent: int | None = None
    depth: int = 0
    value: float | None = None
    text: str | None = None

    @property
    def enabled(self) -> bool:
        return "enabled" in self.states and "sensitive" in self.states

    @property
    def visible(self) -> bool:
        _, _, w, h = self.bounds
        return "visible" in self.states and "showing" in self.states and w > 0 and h > 0

    def centre(self) -> tuple[int, int]:
        x, y, w, h = self.bounds
        return x + w // 2, y + h // 2

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "role": self.role, "name": self.name}
        # "sensitive" is GTK's half of "enabled" (both are needed to act); the model sees "enabled" only.
        enabled = {"enabled"} if self.enabled else set()
        out["states"] = sorted((self.states - {"sensitive", "enabled"}) | enabled)
        out["bounds"] = list(self.bounds)
        if self.actions:
            out["actions"] = list(self.actions)
        if self.value is not None:
            out["value"] = self.value
        if self.text is not None:
            out["text"] = self.text
        if self.parent is not None:
            out["parent"] = self.parent
        return out


@dataclass
class Tree:
    """The accessible elements of the focused application, or why there are none."""

    available: bool
    reason: str | None = None
    application: str | None = None
    window: str | None = None
    elements: list[Element] = field(default_factory=list)
    truncated: str | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"available": self.available}
        if self.reason:
            out["reason"] = self.reason
        if self.available:
            out |= {"application": self.application, "window": self.window}
            out["elements"] = [e.describe() for e in self.elements]
            out["truncated"] = self.truncated is not None
            if self.truncated:
                out["truncation"] = self.truncated
        return out


@dataclass(frozen=True)
class Live:
    """An element as it is now (read again before and after acting on it)."""

    name: str
    states: frozenset[str]
    bounds: tuple[int, int, int, int]
    value: float | None
    text: str | None


def bus_address() -> str:
    """The accessibility bus: $AT_SPI_BUS_ADDRESS, else what `org.a11y.Bus` on the session bus says."""
    explicit = os.environ.get("AT_SPI_BUS_ADDRESS")
    if explicit:
        return explicit
    if not os.environ.get("DBUS_SESSION_BUS_ADDRESS"):
        raise GuiError(
            "tool_error",
            "no session D-Bus (DBUS_SESSION_BUS_ADDRESS is not set), so no accessibility bus: start the "
            "agent inside the desktop session (packages dbus, at-spi2-core)",
        )
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection

    try:
        with open_dbus_connection(bus="SESSION") as session:
            call = new_method_call(DBusAddress("/org/a11y/bus", "org.a11y.Bus", "org.a11y.Bus"), "GetAddress")
            reply = session.send_and_get_reply(call, timeout=CALL_TIMEOUT_S)
    except Exception as exc:
        raise GuiError("tool_error", f"cannot reach the session D-Bus: {exc}") from exc
    if reply.header.message_type.name == "error":
        raise GuiError(
            "tool_error",
            f"the session D-Bus has no accessibility bus ({reply.body[0] if reply.body else 'error'}): install "
            "at-spi2-core (at-spi-bus-launcher) and enable accessibility in the desktop",
        )
    return str(reply.body[0])


class Bus:
    """A blocking connection to the accessibility bus with typed helpers for the calls we make."""

    def __init__(self, address: str) -> None:
        from jeepney.io.blocking import open_dbus_connection

        try:
            self.conn = open_dbus_connection(bus=address)
        except Exception as exc:
            raise GuiError("tool_error", f"cannot connect to the accessibility bus {address!r}: {exc}") from exc

    def close(self) -> None:
        self.conn.close()

    def _ask(self, message: Any) -> Any:
        """Send one message and wait for its reply, at most CALL_TIMEOUT_S."""
        try:
            return self.conn.send_and_get_reply(message, timeout=CALL_TIMEOUT_S)
        except TimeoutError:
            raise GuiError(
                "tool_error",
                f"an application did not answer over AT-SPI within {CALL_TIMEOUT_S:g} s (busy or hung); call "
                "gui.observe again, or act by coordinates",
            ) from None
        except (OSError, ConnectionError, EOFError) as exc:
            raise GuiError(
                "tool_error", f"the accessibility bus connection broke ({exc}); call gui.observe again"
            ) from exc

    def call(self, bus: str, path: str, iface: str, method: str, signature: str | None = None, *args: Any) -> Any:
        from jeepney import DBusAddress, new_method_call

        msg = new_method_call(DBusAddress(path, bus, f"org.a11y.atspi.{iface}"), method, signature, tuple(args))
        reply = self._ask(msg)
        if reply.header.message_type.name == "error":
            raise GuiError("stale_observation", f"the element is gone or does not answer ({reply.body[:1]})")
        return reply.body[0] if len(reply.body) == 1 else reply.body

    def prop(self, bus: str, path: str, iface: str, name: str) -> Any:
        from jeepney import DBusAddress, Properties

        reply = self._ask(Properties(DBusAddress(path, bus, f"org.a11y.atspi.{iface}")).get(name))
        if reply.header.message_type.name == "error":
            raise GuiError("stale_observation", f"the element is gone or does not answer ({reply.body[:1]})")
        return reply.body[0][1]

    def set_prop(self, bus: str, path: str, iface: str, name: str, signature: str, value: Any) -> None:
        from jeepney import DBusAddress, Properties

        reply = self._ask(Properties(DBusAddress(path, bus, f"org.a11y.atspi.{iface}")).set(name, signature, value))
        if reply.header.message_type.name == "error":
            raise GuiError("tool_error", f"the application refused to set {name} ({reply.body[:1]})")

    def states(self, bus: str, path: str) -> frozenset[str]:
        words = self.call(bus, path, "Accessible", "GetState")
        bits = sum(int(w) << (32 * i) for i, w in enumerate(words))
        return frozenset(name for name, bit in STATE_BITS.items() if bits >> bit & 1)

    def children(self, bus: str, path: str) -> list[tuple[str, str]]:
        return [(str(b), str(p)) for b, p in self.call(bus, path, "Accessible", "GetChildren")]

    def extents(self, bus: str, path: str) -> tuple[int, int, int, int]:
        x, y, w, h = self.call(bus, path, "Component", "GetExtents", "u", 0)  # 0: screen coordinates
        return int(x), int(y), int(w), int(h)

    def live(self, element: Element) -> Live:
        """Name, states, bounds, value and text of `element` now."""
        bus, path = element.bus, element.path
        name = str(self.prop(bus, path, "Accessible", "Name"))
        bounds = self.extents(bus, path) if "Component" in element.interfaces else element.bounds
        value = float(self.prop(bus, path, "Value", "CurrentValue")) if "Value" in element.interfaces else None
        text = self.text(element) if "Text" in element.interfaces else None
        return Live(name, self.states(bus, path), bounds, value, text)

    def text(self, element: Element) -> str | None:
        if element.role in SECRET_ROLES:
            return None  # never read a password back
        return str(self.call(element.bus, element.path, "Text", "GetText", "ii", 0, -1))[:500]


@contextmanager
def connect() -> Iterator[Bus]:
    bus = Bus(bus_address())
    try:
        yield bus
    finally:
        bus.close()


def snapshot(window_title: str, max_elements: int = MAX_ELEMENTS, max_depth: int = MAX_DEPTH) -> Tree:
    """The elements of the application whose frame is the focused window (blocking)."""
    try:
        with connect() as bus:
            return _snapshot(bus, window_title, max_elements, max_depth)
    except GuiError as exc:
        return Tree(available=False, reason=exc.message)
    except Exception as exc:  # a broken bus, a timeout: the observation goes on without a tree
        return Tree(available=False, reason=f"reading the accessibility tree failed: {type(exc).__name__}: {exc}")


def _snapshot(bus: Bus, window_title: str, max_elements: int, max_depth: int) -> Tree:
    deadline = time.monotonic() + SNAPSHOT_BUDGET_S
    frames: list[tuple[str, str, str, str, frozenset[str]]] = []  # app name, bus, path, title, states
    for app_bus, app_path in bus.children(REGISTRY, ROOT_PATH):
        if time.monotonic() > deadline:
            break  # applications that answer slowly: look among the frames found so far
        try:
            app_name = str(bus.prop(app_bus, app_path, "Accessible", "Name"))
            for fbus, fpath in bus.children(app_bus, app_path):
                title = str(bus.prop(fbus, fpath, "Accessible", "Name"))
                frames.append((app_name, fbus, fpath, title, bus.states(fbus, fpath)))
        except GuiError:
            continue  # an application that does not answer is not the one in front
    chosen = next((f for f in frames if window_title and f[3] == window_title), None)
    chosen = chosen or next((f for f in frames if "active" in f[4]), None)
    if chosen is None:
        return Tree(
            available=True,
            reason=f"no accessible application shows the focused window {window_title[:80]!r} (the application "
            "may have no accessibility support, e.g. Tk, or accessibility is off); use coordinates",
        )
    app_name, fbus, fpath, title, _ = chosen
    tree = Tree(available=True, application=app_name, window=title)
    stack: list[tuple[str, str, int, int | None]] = [(fbus, fpath, 0, None)]
    while stack:
        obj_bus, obj_path, depth, parent = stack.pop()
        if len(tree.elements) >= max_elements:
            tree.truncated = f"cut at {max_elements} elements; act on what is listed or use coordinates"
            break
        if time.monotonic() > deadline:
            tree.truncated = f"cut after {SNAPSHOT_BUDGET_S:g} s of reading; the application answers slowly"
            break
        try:
            element = _read(bus, obj_bus, obj_path, len(tree.elements) + 1, depth, parent)
        except GuiError:
            continue
        if depth > 0 and "showing" not in element.states:
            continue  # not on screen, nor anything under it
        listed = depth == 0 or bool(element.name) or bool(element.interfaces & set(INTERACTIVE_INTERFACES))
        if listed:
            tree.elements.append(element)
        below = element.id if listed else parent
        try:
            kids = bus.children(obj_bus, obj_path)
        except GuiError:
            kids = []  # it went away while we read it
        if kids and depth >= max_depth:
            tree.truncated = f"cut at depth {max_depth}; deeper elements are not listed"
            continue
        stack.extend((b, p, depth + 1, below) for b, p in reversed(kids))
    return tree


def _read(bus: Bus, obj_bus: str, path: str, eid: int, depth: int, parent: int | None) -> Element:
    interfaces = frozenset(str(i).rsplit(".", 1)[-1] for i in bus.call(obj_bus, path, "Accessible", "GetInterfaces"))
    role = str(bus.call(obj_bus, path, "Accessible", "GetRoleName"))
    name = str(bus.prop(obj_bus, path, "Accessible", "Name"))
    states = bus.states(obj_bus, path)
    bounds = bus.extents(obj_bus, path) if "Component" in interfaces else (0, 0, 0, 0)
    actions: tuple[str, ...] = ()
    if "Action" in interfaces:
        count = int(bus.prop(obj_bus, path, "Action", "NActions"))
        actions = tuple(str(bus.call(obj_bus, path, "Action", "GetName", "i", i)) for i in range(min(count, 8)))
    value = float(bus.prop(obj_bus, path, "Value", "CurrentValue")) if "Value" in interfaces else None
    element = Element(eid, obj_bus, path, role, name, states, bounds, interfaces, actions, parent, depth, value)
    if "Text" in interfaces and role not in SECRET_ROLES:
        element = Element(**{**element.__dict__, "text": bus.text(element)})
    return element


def click_action(element: Element) -> int | None:
    """The index of the action that clicks `element`, None if it offers none."""
    lowered = [a.lower() for a in element.actions]
    for wanted in CLICK_ACTIONS:
        if wanted in lowered:
            return lowered.index(wanted)
    return None
