"""The live view's marks: the elements of the gui toolset's last observation (AT-SPI, a real GTK
app on Xvfb), as boxes in the frame's pixels."""

from __future__ import annotations

from pathlib import Path

from device_agent.screen.hub import marks_from
from device_agent.screen.source import X11Source
from tests.gui.conftest import TkApp
from tests.gui.fakes import make_ctx
from tests.gui.test_atspi import element, observe
from tests.gui.test_x11 import gui


async def test_frames_asked_with_marks_carry_the_last_observations_elements_in_frame_pixels(
    xvfb: str, gtk_app: TkApp, tmp_path: Path
) -> None:
    ctx = make_ctx(tmp_path)
    source = X11Source(xvfb, marks_from(ctx))
    async with gui(xvfb, tmp_path, ctx=ctx) as client:
        assert (await source.grab(640, 60, marks=True)).marks == ()  # nothing observed yet
        obs = await observe(client)
        x, y, w, h = element(obs, "Press me")["bounds"]
        frame = await source.grab(640, 60, marks=True)
        unmarked = await source.grab(640, 60, marks=False)
    (press,) = [m for m in frame.marks if m.name == "Press me"]
    assert (press.x, press.y, press.w, press.h) == (x // 2, y // 2, (x + w) // 2 - x // 2, (y + h) // 2 - y // 2)
    assert unmarked.marks == ()
