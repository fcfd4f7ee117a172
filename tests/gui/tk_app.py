"""An instrumented Tk app for the gui tests: it publishes its state to a JSON file on every event.

Run as `python tk_app.py STATE_FILE` with DISPLAY set. The main window ("Orrery test app", at
0,0, 480x320) holds a button and an entry; a second window ("Second window") sits at 700,80.
There is no window manager under Xvfb, so windows stay exactly where they are placed and the
keyboard focus only moves when someone sets it (the app puts it on the entry at start).

State: `ready`, `clicks` (button presses), `last_click` {x, y, button} in screen pixels,
`entry` (its text), `focused` ("main" / "second"), `keys` (non-modifier key presses with the
ctrl/shift state), `windows` {name: X window id}, `widgets` {name: [x, y, width, height]},
`last_release` {x, y, button}, `double_clicks` (left double clicks), `wheel` (wheel "button" presses
with their position), `dragged` (pointer motions with button 1 held).
"""

from __future__ import annotations

import json
import os
import sys
import tkinter as tk
from pathlib import Path
from typing import Any

MODIFIER_KEYSYMS = {"Control_L", "Control_R", "Shift_L", "Shift_R", "Alt_L", "Alt_R", "Super_L", "Super_R"}


class App:
    def __init__(self, state_file: Path) -> None:
        self.state_file = state_file
        self.state: dict[str, Any] = {
            "ready": False,
            "clicks": 0,
            "last_click": None,
            "entry": "",
            "focused": None,
            "keys": [],
            "windows": {},
            "widgets": {},
            "last_release": None,
            "double_clicks": 0,
            "wheel": [],
            "dragged": 0,
        }
        self.root = tk.Tk()
        self.root.title("Orrery test app")
        self.root.geometry("480x320+0+0")
        self.second = tk.Toplevel(self.root)
        self.second.title("Second window")
        self.second.geometry("320x200+700+80")
        tk.Label(self.second, text="second window").pack(padx=20, pady=20)

        self.button = tk.Button(self.root, text="Press me", command=self.pressed)
        self.button.place(x=40, y=40, width=160, height=50)
        self.text = tk.StringVar()
        self.entry = tk.Entry(self.root, textvariable=self.text)
        self.entry.place(x=40, y=140, width=400, height=30)
        self.text.trace_add("write", self.changed)

        self.root.bind_all("<ButtonPress>", self.clicked, add="+")
        self.root.bind_all("<KeyPress>", self.key, add="+")
        self.root.bind_all("<ButtonRelease>", self.released, add="+")
        self.root.bind_all(
            "<Double-Button-1>", lambda _e: self.update(double_clicks=self.state["double_clicks"] + 1), add="+"
        )
        self.root.bind_all("<B1-Motion>", lambda _e: self.update(dragged=self.state["dragged"] + 1), add="+")
        for name, window in (("main", self.root), ("second", self.second)):
            window.bind("<FocusIn>", lambda _event, n=name: self.update(focused=n), add="+")
        self.root.after(300, self.start)

    def start(self) -> None:
        """Once mapped: take the keyboard focus, publish the layout, say ready."""
        self.root.update_idletasks()
        self.entry.focus_force()
        self.state["windows"] = {"main": int(self.root.wm_frame(), 16), "second": int(self.second.wm_frame(), 16)}
        self.state["widgets"] = {
            name: [w.winfo_rootx(), w.winfo_rooty(), w.winfo_width(), w.winfo_height()]
            for name, w in (("button", self.button), ("entry", self.entry))
        }
        self.update(ready=True)

    def pressed(self) -> None:
        self.update(clicks=self.state["clicks"] + 1)

    def clicked(self, event: tk.Event[Any]) -> None:
        if event.num in (4, 5, 6, 7):  # X11 wheel buttons
            self.state["wheel"].append({"x": event.x_root, "y": event.y_root, "button": event.num})
        self.update(last_click={"x": event.x_root, "y": event.y_root, "button": event.num})

    def released(self, event: tk.Event[Any]) -> None:
        self.update(last_release={"x": event.x_root, "y": event.y_root, "button": event.num})

    def changed(self, *_: object) -> None:
        self.update(entry=self.text.get())

    def key(self, event: tk.Event[Any]) -> None:
        if event.keysym in MODIFIER_KEYSYMS:
            return
        state = int(event.state) if isinstance(event.state, int) else 0
        self.state["keys"].append({"keysym": event.keysym, "ctrl": bool(state & 0x4), "shift": bool(state & 0x1)})
        self.update()

    def update(self, **changes: Any) -> None:
        """Apply `changes` and write the whole state atomically (readers never see half a file)."""
        self.state.update(changes)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.state_file)


if __name__ == "__main__":
    App(Path(sys.argv[1])).root.mainloop()
