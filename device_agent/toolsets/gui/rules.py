"""Pure rules of the `gui` toolset: argument validation, key grammar, coordinate mapping.

Nothing here touches a display, so every rule is unit-tested without one. Validation failures
raise `GuiError("invalid_arguments", ...)` with a message that says what was wrong and what is
accepted. Typed text is never echoed in a message: it may be a password.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_TEXT = 2000
MAX_KEY_PARTS = 5
OBSERVATION_TTL_S = 60.0
WAIT_MS = (200, 3000)
SCROLL_AMOUNT = (1, 10)

BUTTONS = {"left": 1, "middle": 2, "right": 3}
# X11 wheel buttons; xdotool "clicks" them like any other button.
SCROLL_BUTTONS = {"up": 4, "down": 5, "left": 6, "right": 7}
MODIFIERS = {"ctrl": "ctrl", "control": "ctrl", "alt": "alt", "shift": "shift", "super": "super"}
# Accepted final keys (lower-case spelling -> X keysym). Letters and digits are added below.
NAMED_KEYS = {
    "enter": "Return",
    "return": "Return",
    "tab": "Tab",
    "escape": "Escape",
    "esc": "Escape",
    "space": "space",
    "backspace": "BackSpace",
    "delete": "Delete",
    "insert": "Insert",
    "home": "Home",
    "end": "End",
    "pageup": "Prior",
    "page_up": "Prior",
    "pagedown": "Next",
    "page_down": "Next",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "minus": "minus",
    "equal": "equal",
    "comma": "comma",
    "period": "period",
    "slash": "slash",
    **{f"f{n}": f"F{n}" for n in range(1, 13)},
}
FINAL_KEYS = {**NAMED_KEYS, **{c: c for c in "abcdefghijklmnopqrstuvwxyz0123456789"}}
KEY_HELP = (
    "a key is up to 4 distinct modifiers (ctrl, alt, shift, super) and one final key joined by '+', "
    "e.g. 'ctrl+s', 'ctrl+shift+t', 'enter', 'alt+f4'; final keys: a-z, 0-9, f1-f12, "
    + ", ".join(sorted(k for k in NAMED_KEYS if not re.fullmatch(r"f\d+", k)))
    + "; to type characters use gui.type instead"
)
_ACTION_ID = re.compile(r"[A-Za-z0-9._:-]{8,128}")
# Control characters other than newline and tab have no key to press and would make xdotool
# synthesize odd keysyms.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class GuiError(Exception):
    """A refusal with a wire error code; `details` go into the structured result."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


@dataclass(frozen=True)
class Gesture:
    """One input, in device pixels, that a backend turns into real events."""

    kind: str  # click | type | key | scroll | drag
    points: tuple[tuple[int, int], ...] = ()
    button: int = 1
    count: int = 1
    text: str = ""
    keys: str = ""
    window: int = 0


def check_action_id(action_id: str) -> None:
    """Refuse an action id that cannot be a deliberate, unique name for one action."""
    if not _ACTION_ID.fullmatch(action_id):
        raise GuiError(
            "invalid_arguments",
            "action_id must be 8-128 characters of letters, digits, '.', '_', ':' or '-', unique per "
            "intended action (e.g. a UUID); reuse it only to retry exactly the same call",
        )


def check_text(text: str) -> None:
    """Text for `gui.type`: 1..2000 characters, no NUL or other control characters but \\n and \\t."""
    if not text:
        raise GuiError("invalid_arguments", "text is empty; pass the characters to type")
    if len(text) > MAX_TEXT:
        raise GuiError(
            "invalid_arguments",
            f"text has {len(text)} characters, more than the {MAX_TEXT} allowed per call; split it over "
            "several gui.type calls (each needs the observation returned by the previous one)",
        )
    if "\x00" in text:
        raise GuiError("invalid_arguments", "text contains a NUL character, which cannot be typed; remove it")
    if _CONTROL.search(text):
        raise GuiError(
            "invalid_arguments",
            "text contains a control character; only printable characters, newline and tab can be typed. "
            "Use gui.key for keys such as escape or backspace",
        )


def parse_key(key: str) -> str:
    """Validate a key combination and return its xdotool spelling (e.g. 'ctrl+shift+t').

    Strict on purpose: only names from fixed tables pass, so nothing the caller writes can become
    another xdotool command, option or shell syntax ("A;shutdown" fails on ';').
    """
    shown = repr(key[:40])
    parts = key.strip().lower().split("+") if len(key) <= 64 else []
    if not parts or any(not p for p in parts) or len(parts) > MAX_KEY_PARTS:
        raise GuiError("invalid_arguments", f"key {shown} is not a valid combination: {KEY_HELP}")
    *mods, final = parts
    canonical = [MODIFIERS.get(m) for m in mods]
    if None in canonical:
        bad = next(m for m in mods if m not in MODIFIERS)
        raise GuiError("invalid_arguments", f"key {shown}: {bad[:20]!r} is not a modifier: {KEY_HELP}")
    if len(set(canonical)) != len(canonical):
        raise GuiError("invalid_arguments", f"key {shown} repeats a modifier: {KEY_HELP}")
    if final not in FINAL_KEYS:
        raise GuiError("invalid_arguments", f"key {shown}: {final[:20]!r} is not an accepted key: {KEY_HELP}")
    return "+".join([*(m for m in canonical if m), FINAL_KEYS[final]])


def check_point(x: int, y: int, width: int, height: int, name: str = "x, y") -> None:
    """Coordinates are in the screenshot's own pixels: 0 <= x < width, 0 <= y < height."""
    if not (0 <= x < width and 0 <= y < height):
        raise GuiError(
            "invalid_arguments",
            f"({name}) = ({x}, {y}) is outside the screenshot, which is {width}x{height} pixels: use "
            f"0 <= x <= {width - 1} and 0 <= y <= {height - 1}, in the pixels of the observation's image",
        )


def to_device(x: int, y: int, shot: tuple[int, int], device: tuple[int, int]) -> tuple[int, int]:
    """Map a screenshot pixel to the device pixel under its centre.

    Pixel (x, y) covers [x, x+1) in screenshot space; its centre (x + 0.5) scales to
    (2x + 1) * W / (2w) on the device. Integer floor division keeps it exact: on a half-size
    screenshot (10, 10) -> (21, 21), and without scaling the mapping is the identity.
    """
    (w, h), (dw, dh) = shot, device
    return ((2 * x + 1) * dw // (2 * w), (2 * y + 1) * dh // (2 * h))


def digest(tool: str, arguments: Mapping[str, Any]) -> str:
    """SHA-256 of the tool and its arguments (action_id excluded), in canonical JSON."""
    body = {k: v for k, v in arguments.items() if k != "action_id"}
    canonical = json.dumps({"tool": tool, "arguments": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def xdotool_argv(gesture: Gesture) -> list[str]:
    """The xdotool arguments (after the program name) for a gesture; never a shell string.

    Text is a single argv element after `--`, so xdotool types it literally: it cannot be read
    as an option or a chained command. (Debian 12's xdotool 3.20160805 has no `type --file`.)
    """
    moves = [["mousemove", str(x), str(y)] for x, y in gesture.points]
    if gesture.kind == "click":
        click = ["click", "--repeat", str(gesture.count), "--delay", "80", str(gesture.button)]
        return [*moves[0], *click]
    if gesture.kind == "scroll":
        click = ["click", "--repeat", str(gesture.count), "--delay", "40", str(gesture.button)]
        return [*moves[0], *click]
    if gesture.kind == "drag":
        (x0, y0), (x1, y1) = gesture.points
        # A midpoint move and short pauses: toolkits start a drag only after motion with the button down.
        mid = ["mousemove", str((x0 + x1) // 2), str((y0 + y1) // 2)]
        button = str(gesture.button)
        return [*moves[0], "mousedown", button, "sleep", "0.05", *mid, "sleep", "0.05", *moves[1], "mouseup", button]
    if gesture.kind == "key":
        return ["key", "--clearmodifiers", gesture.keys]
    if gesture.kind == "focus":
        window = str(gesture.window)
        return ["windowraise", window, "windowfocus", "--sync", window]
    if gesture.kind == "type":
        return ["type", "--clearmodifiers", "--delay", "12", "--", gesture.text]
    raise ValueError(f"unknown gesture {gesture.kind!r}")


# Released after any failed or cancelled input: buttons first, then both sides of each modifier.
RELEASE_ARGV = [
    *("mouseup", "1", "mouseup", "2", "mouseup", "3"),
    *("keyup", "Control_L", "Control_R", "Alt_L", "Alt_R", "Shift_L", "Shift_R", "Super_L", "Super_R"),
]
