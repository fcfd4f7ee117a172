"""Frame geometry: scaling to fit, and the gui observation's marks in a frame's pixels."""

from __future__ import annotations

import asyncio

from device_agent.screen.frames import Mark, fit, marks_in_frame, size_of
from device_agent.toolsets.gui.rules import to_device
from tests.unit.device_agent.screen.screens import DrawnScreen


def test_a_frame_is_scaled_down_to_its_longest_side_and_never_up() -> None:
    assert fit(1280, 800, 640) == (640, 400)
    assert fit(800, 1280, 640) == (400, 640)
    assert fit(320, 200, 640) == (320, 200)


def test_marks_are_boxes_in_the_frames_pixels_and_those_off_screen_are_left_out() -> None:
    marks = [Mark(1, "OK", 100, 60, 200, 40), Mark(2, "gone", 2000, 10, 50, 50), Mark(3, "edge", -20, -20, 60, 60)]
    shown = marks_in_frame(marks, (640, 400), (1280, 800))
    assert shown == [Mark(1, "OK", 50, 30, 100, 20), Mark(3, "edge", 0, 0, 20, 20)]


def test_a_mark_clicked_at_its_centre_in_the_frame_lands_inside_it_on_the_screen() -> None:
    (box,) = marks_in_frame([Mark(1, "OK", 101, 61, 199, 39)], (640, 400), (1280, 800))
    x, y = to_device(box.x + box.w // 2, box.y + box.h // 2, (640, 400), (1280, 800))
    assert 101 <= x < 300 and 61 <= y < 100


def test_a_drawn_screens_frame_has_the_size_it_claims() -> None:
    frame = asyncio.run(DrawnScreen(1000, 500).grab(max_side=400, quality=50))
    assert size_of(frame.image) == (frame.width, frame.height) == (400, 200)
