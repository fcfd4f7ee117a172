"""A large screen's screenshot is shrunk to fit the result's image cap instead of being left out
(issue 19), and a point on the shrunk image maps back to the screen pixel it shows."""

from __future__ import annotations

import os

from device_agent.router import MAX_IMAGE_BYTES
from device_agent.toolsets.gui.rules import to_device
from device_agent.toolsets.gui.x11 import MAX_SCREENSHOT_PNG_BYTES, fit_png, shrink


def noise(width: int, height: int) -> bytes:
    return os.urandom(3 * width * height)  # incompressible: the worst case for PNG size


def pixels(png: bytes) -> tuple[int, int]:
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_a_4k_screen_is_shrunk_to_fit_and_its_base64_passes_the_image_cap() -> None:
    png, w, h = fit_png(noise(3840, 2160), 3840, 2160)
    assert len(png) <= MAX_SCREENSHOT_PNG_BYTES
    assert len(png) * 4 / 3 < MAX_IMAGE_BYTES  # base64 of it fits: the model sees a screenshot
    assert (w, h) == pixels(png) and w < 3840 and 3840 / w == 2160 / h
    assert png.endswith(b"IEND\xaeB`\x82")


def test_a_small_screen_is_left_as_it_is() -> None:
    rgb = bytes(3 * 640 * 400)
    png, w, h = fit_png(rgb, 640, 400)
    assert (w, h) == (640, 400) == pixels(png)


def test_shrinking_keeps_every_kth_pixel_and_to_device_maps_back_into_it() -> None:
    width, height, k = 7, 5, 2
    rgb = bytes(b for y in range(height) for x in range(width) for b in (x, y, 200))
    small, w, h = shrink(rgb, width, height, k)
    assert (w, h) == (4, 3)
    for sy in range(h):
        for sx in range(w):
            r, g, _b = small[3 * (sy * w + sx) : 3 * (sy * w + sx) + 3]
            assert (r, g) == (sx * k, sy * k)  # the pixel shown is the screen's (k*sx, k*sy)
            dx, dy = to_device(sx, sy, (w, h), (width, height))
            assert sx * k <= dx < min(width, (sx + 1) * k + 1) and sy * k <= dy < min(height, (sy + 1) * k + 1)
