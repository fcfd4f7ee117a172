"""Frames as the live view and the recorder want them: scaled to fit, JPEG, with marks.

Pillow is imported only here and only when a frame is made: an agent with no screen never loads it.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

SourceKind = Literal["x11", "browser"]


@dataclass(frozen=True)
class Mark:
    """An element of the last observation, in screen pixels."""

    id: int
    name: str
    x: int
    y: int
    w: int
    h: int


@dataclass(frozen=True)
class Frame:
    """One encoded frame: the image's size (the coordinate space of forwarded input) and the screen's."""

    image: bytes
    width: int
    height: int
    screen_width: int
    screen_height: int
    source: SourceKind
    mime: Literal["image/jpeg", "image/png"] = "image/jpeg"
    marks: tuple[Mark, ...] = field(default=())


def fit(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The size of a `width` x `height` image scaled down (never up) so its longer side is at most `max_side`."""
    longer = max(width, height)
    if longer <= max_side:
        return width, height
    return max(1, round(width * max_side / longer)), max(1, round(height * max_side / longer))


def jpeg_from_rgb(rgb: bytes, width: int, height: int, max_side: int, quality: int) -> tuple[bytes, int, int]:
    """Raw RGB (3 bytes a pixel) as a JPEG scaled to `max_side`, with the JPEG's size (blocking)."""
    from PIL import Image

    image = Image.frombytes("RGB", (width, height), rgb)
    return _jpeg(image, max_side, quality)


def rescale_jpeg(data: bytes, max_side: int, quality: int) -> tuple[bytes, int, int]:
    """An image (JPEG or PNG) as a JPEG scaled to `max_side`; left as it is if it already fits
    and is a JPEG (blocking)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if image.format == "JPEG" and max(image.size) <= max_side:
            return data, image.width, image.height
        return _jpeg(image.convert("RGB"), max_side, quality)


def size_of(data: bytes) -> tuple[int, int]:
    """The pixel size of an encoded image (blocking)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.width, image.height


def _jpeg(image: object, max_side: int, quality: int) -> tuple[bytes, int, int]:
    from PIL import Image

    assert isinstance(image, Image.Image)
    w, h = fit(image.width, image.height, max_side)
    if (w, h) != image.size:
        image = image.resize((w, h), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue(), w, h


def to_frame(x: int, y: int, frame: tuple[int, int], screen: tuple[int, int]) -> tuple[int, int]:
    """A screen pixel's place in a frame (for marks and overlays): the inverse of `rules.to_device`."""
    (w, h), (sw, sh) = frame, screen
    return x * w // sw, y * h // sh


def marks_in_frame(marks: Iterable[Mark], frame: tuple[int, int], screen: tuple[int, int]) -> list[Mark]:
    """Marks in a frame's pixels; those wholly off the screen are left out."""
    out = []
    for m in marks:
        x0, y0 = to_frame(max(0, m.x), max(0, m.y), frame, screen)
        x1, y1 = to_frame(min(screen[0], m.x + m.w), min(screen[1], m.y + m.h), frame, screen)
        if x1 > x0 and y1 > y0:
            out.append(Mark(m.id, m.name, x0, y0, x1 - x0, y1 - y0))
    return out


def overlay(jpeg: bytes, caption: str, point: tuple[int, int] | None, quality: int) -> bytes:
    """A frame with a caption along its bottom edge and, if `point` (frame pixels), a ring there
    (what a recording shows of the action that ran then) (blocking)."""
    from PIL import Image, ImageDraw

    with Image.open(io.BytesIO(jpeg)) as opened:
        image = opened.convert("RGB")
    draw = ImageDraw.Draw(image)
    if point is not None:
        x, y = point
        for r, colour in ((12, (255, 0, 0)), (13, (255, 255, 255))):
            draw.ellipse((x - r, y - r, x + r, y + r), outline=colour, width=2)
        draw.line((x - 4, y, x + 4, y), fill=(255, 0, 0), width=2)
        draw.line((x, y - 4, x, y + 4), fill=(255, 0, 0), width=2)
    if caption:
        box = draw.textbbox((0, 0), caption)
        top = image.height - (box[3] - box[1]) - 8
        draw.rectangle((0, top, min(image.width, box[2] + 8), image.height), fill=(0, 0, 0))
        draw.text((4, top + 3), caption, fill=(255, 255, 0))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()
