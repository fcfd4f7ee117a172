"""An instrumented GTK 3 app for the accessibility (AT-SPI) tests; it publishes its state to a JSON file.

Run with Debian's system python (`/usr/bin/python3`, packages python3-gi and gir1.2-gtk-3.0) as
`gtk_app.py STATE_FILE`, with DISPLAY and a session D-Bus whose AT-SPI bus is running (GTK
exposes its widget tree there). The window "Orrery GTK app" at 0,0 holds a button "Press me",
an entry "Name", a check box "Subscribe", a slider "Volume" (0-100) and a disabled button
"Locked". Tk has no accessibility bridge, which is why this app exists next to tk_app.py.

State: `ready`, `clicks` (presses of "Press me"), `locked_clicks`, `entry` (its text),
`subscribed` (the check box), `volume` (the slider), `focus` (the name of the focused widget),
`renamed` (after a test wrote STATE_FILE with the suffix .rename: the check box's new label).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import gi

gi.require_version("Gtk", "3.0")
from gi.repository import GLib, Gtk  # noqa: E402


class App:
    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file
        self.state: dict[str, Any] = {
            "ready": False,
            "clicks": 0,
            "locked_clicks": 0,
            "entry": "",
            "subscribed": False,
            "volume": 10.0,
            "focus": None,
        }
        self.window = Gtk.Window(title="Orrery GTK app")
        self.window.set_default_size(480, 360)
        self.window.move(0, 0)
        self.window.connect("destroy", Gtk.main_quit)
        box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL, spacing=12)
        box.set_border_width(16)
        self.window.add(box)

        self.button = Gtk.Button(label="Press me")
        self.button.connect("clicked", lambda _b: self.update(clicks=self.state["clicks"] + 1))
        self.entry = Gtk.Entry()
        self.entry.get_accessible().set_name("Name")
        self.entry.connect("changed", lambda e: self.update(entry=e.get_text()))
        self.check = Gtk.CheckButton(label="Subscribe")
        self.check.connect("toggled", lambda c: self.update(subscribed=c.get_active()))
        self.scale = Gtk.Scale.new_with_range(Gtk.Orientation.HORIZONTAL, 0, 100, 1)
        self.scale.set_value(10)
        self.scale.get_accessible().set_name("Volume")
        self.scale.connect("value-changed", lambda s: self.update(volume=s.get_value()))
        self.locked = Gtk.Button(label="Locked")
        self.locked.set_sensitive(False)
        self.locked.connect("clicked", lambda _b: self.update(locked_clicks=self.state["locked_clicks"] + 1))
        for name, widget in (
            ("button", self.button),
            ("entry", self.entry),
            ("check", self.check),
            ("scale", self.scale),
            ("locked", self.locked),
        ):
            box.pack_start(widget, False, False, 0)
            widget.connect("focus-in-event", lambda _w, _e, n=name: self.update(focus=n) and False)
        self.window.show_all()
        GLib.timeout_add(300, self.start)
        GLib.timeout_add(50, self.control)

    def start(self) -> bool:
        self.window.present()
        self.update(ready=True)
        return False

    def control(self) -> bool:
        """A test asks for a change by writing STATE_FILE.rename: the check box gets that label."""
        request = self.state_file.with_suffix(".rename")
        if request.exists():
            self.check.set_label(request.read_text())
            request.unlink()
            self.update(renamed=True)
        return True

    def update(self, **changes: Any) -> bool:
        """Apply `changes` and write the whole state atomically (readers never see half a file)."""
        self.state.update(changes)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.state_file)
        return False


if __name__ == "__main__":
    App(Path(sys.argv[1]))
    Gtk.main()
