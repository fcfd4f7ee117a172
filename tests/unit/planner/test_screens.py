"""Screenshots for the model: the size it sees is bounded, large images are compressed rather than
dropped, and the coordinate mapping back to the screenshot is exact (every pixel, odd sizes)."""

from __future__ import annotations

import base64
import io
import random

import pytest
from PIL import Image, ImageDraw

from device_agent.toolsets.gui.rules import to_device
from orchestrator.planner.screens import Frame, Limits, Unreadable, fit, prepare, scale

ODD_SIZES = [(1279, 799), (1921, 1081), (2561, 1441), (3840, 2160), (7, 5), (1001, 1001), (1366, 768)]
LIMITS = [
    Limits(),
    Limits(max_side=640, max_pixels=10**9),
    Limits(max_side=1280, max_pixels=500_000),
    Limits(333, 10**9),
]


def screenshot(width: int, height: int, noise: bool = True) -> bytes:
    """A desktop-like PNG: flat panels, text-like strokes, and a photo-like (noisy) region that
    makes PNG large, as wallpapers and video do."""
    image = Image.new("RGB", (width, height), (236, 236, 236))
    draw = ImageDraw.Draw(image)
    rng = random.Random(width * 31 + height)
    for _ in range(200):
        x, y = rng.randrange(width), rng.randrange(height)
        draw.rectangle((x, y, x + rng.randrange(20, 300), y + rng.randrange(10, 60)), fill=(40, 90, 160))
        draw.text((x + 4, y + 4), "Save  Open  File  Edit", fill=(255, 255, 255))
    if noise:
        patch = Image.frombytes("RGB", (width // 2, height // 2), rng.randbytes(width // 2 * (height // 2) * 3))
        image.paste(patch, (width // 4, height // 4))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize("size", ODD_SIZES)
@pytest.mark.parametrize("limits", LIMITS)
def test_every_shown_pixel_maps_to_a_source_pixel_that_maps_back_to_it(size: tuple[int, int], limits: Limits) -> None:
    shown = fit(*size, limits)
    frame = Frame(size, shown)
    for x in range(shown[0]):
        sx = scale(x, shown[0], size[0])
        assert 0 <= sx < size[0]
        assert scale(sx, size[0], shown[0]) == x
    for y in range(shown[1]):
        sy = scale(y, shown[1], size[1])
        assert 0 <= sy < size[1]
        assert scale(sy, size[1], shown[1]) == y
    corner = frame.to_source(shown[0] - 1, shown[1] - 1)
    assert frame.to_shown(*corner) == (shown[0] - 1, shown[1] - 1)


@pytest.mark.parametrize("size", ODD_SIZES)
def test_the_shown_size_is_bounded_and_keeps_the_aspect_ratio(size: tuple[int, int]) -> None:
    for limits in LIMITS:
        w, h = fit(*size, limits)
        assert max(w, h) <= limits.max_side and w * h <= limits.max_pixels
        assert abs(w * size[1] - h * size[0]) < size[0] + size[1]  # each side floored: under a pixel off
        if max(size) <= limits.max_side and size[0] * size[1] <= limits.max_pixels:
            assert (w, h) == size


def test_the_mapping_is_the_identity_without_scaling_and_composes_with_the_devices() -> None:
    frame = Frame((1280, 800), (1280, 800))
    assert not frame.scaled and frame.to_source(0, 0) == (0, 0) and frame.to_source(1279, 799) == (1279, 799)
    # The model sees 640x400 of a 1280x800 screenshot of a 2560x1600 screen: both hops centre the pixel.
    frame = Frame((1280, 800), (640, 400))
    assert frame.to_source(61, 33) == (123, 67)
    assert to_device(*frame.to_source(61, 33), (1280, 800), (2560, 1600)) == (247, 135)


def test_a_large_screenshot_is_downscaled_and_compressed_not_dropped() -> None:
    png = screenshot(3840, 2160)
    data = base64.b64encode(png).decode()
    assert len(data) > 3 * 1024 * 1024  # the size a device used to leave out
    limits = Limits(max_side=1280, max_pixels=1280 * 800, max_bytes=512 * 1024)
    shown = prepare(data, "image/png", limits)
    assert shown.original == (3840, 2160)
    assert max(shown.size) <= 1280 and shown.size[0] * shown.size[1] <= 1280 * 800
    assert shown.bytes_in == len(png) and shown.bytes_out <= limits.max_bytes
    assert shown.bytes_out * 8 < shown.bytes_in, (shown.bytes_in, shown.bytes_out)
    decoded = Image.open(io.BytesIO(base64.b64decode(shown.data)))
    assert decoded.size == shown.size
    assert decoded.format == ("JPEG" if shown.mime_type == "image/jpeg" else "PNG")


def test_a_flat_screenshot_stays_png_and_a_small_one_is_passed_unchanged() -> None:
    flat = base64.b64encode(screenshot(2560, 1440, noise=False)).decode()
    shown = prepare(flat, "image/png", Limits())
    assert shown.mime_type == "image/png" and shown.size == (1280, 720)
    small = base64.b64encode(screenshot(640, 400)).decode()
    same = prepare(small, "image/png", Limits())
    assert same.data == small and same.size == same.original == (640, 400)


def test_a_byte_limit_below_any_jpeg_shrinks_the_image_further() -> None:
    data = base64.b64encode(screenshot(1280, 800)).decode()
    shown = prepare(data, "image/png", Limits(max_bytes=20 * 1024))
    assert shown.bytes_out <= 20 * 1024 and shown.size[0] < 1280
    assert abs(shown.size[0] / shown.size[1] - 1.6) < 0.05


@pytest.mark.parametrize(
    "data", ["not base64!", base64.b64encode(b"not an image").decode(), base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()]
)
def test_an_unreadable_image_is_a_reason_not_a_crash(data: str) -> None:
    with pytest.raises(Unreadable) as caught:
        prepare(data, "image/png", Limits())
    assert caught.value.message
