"""The `gui` toolset (Linux X11): observe the screen, then click, type and press keys on it.

`build(ctx)` makes the MCP server (see `server`), `check(ctx)` tells whether this device can run
it (see `display`). Screenshots come from mss, window state from python-xlib, input from the
`xdotool` program run as an argv list, never through a shell (why: `x11`); the focused
application's accessible elements from AT-SPI over D-Bus (`atspi`), acted on by `grounding`.
The safety rules (observation-bound input, action receipts, one controller per display, the
stop latch) follow the device-safety note and are enforced in `control`.
"""

from device_agent.toolsets.gui.display import check
from device_agent.toolsets.gui.server import build

__all__ = ["build", "check"]
